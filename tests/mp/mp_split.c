/*
 * mp_split.c - one rank of the loom_comm_split tests (test_split.sh).
 *
 * usage: mp_split MODE [VICTIM]
 *   basic   three splits of the job: even/odd ranks (key = rank), pairs
 *           (color rank/2, keys reversing the order), and every rank but
 *           the last (which passes LOOM_SPLIT_NOCOLOR and must get NULL).
 *           Each child's rank and size are checked against the rule
 *           (key, then parent rank), its allgather of parent ranks
 *           against the expected order, and its allreduce and a ring of
 *           sends against the values; then allreduces and allgathers on
 *           the parent and on two children at once (non-blocking, one
 *           thread), and the parent and a child from two threads; and a
 *           split of a child.
 *           "OK basic ...".
 *   abort   even/odd children; rank 0 aborts its child (loom_comm_abort):
 *           rank 2's next operation on it must fail, and the parent and
 *           the odd child must go on working.  "OK abort ...".
 *   revoke  the same with loom_comm_revoke on rank 0; then the even
 *           ranks' split of the revoked child must fail with
 *           LOOM_ERR_REVOKED.  "OK revoke ...".
 *   kill    even/odd children; rank VICTIM is SIGKILLed: the survivors'
 *           operations on the parent and on the child holding VICTIM
 *           must fail within LOOM_TIMEOUT, the other child must work.
 *           "OK kill parent_ms=P child_ms=C|sibling=ok".
 *   killsplit  the ranks split over and over (and use and destroy each
 *           child) while rank VICTIM is SIGKILLed at a random moment in
 *           the first 0.4 s: every survivor's split must fail, none hang
 *           and no *newcomm be set.  "OK killsplit after N splits ...".
 *   othercall  the last rank calls loom_allreduce where the others call
 *           loom_comm_split: every rank fails (LOOM_ERR_MISMATCH).
 *           "OK othercall ms=T code=... msg=...".
 *   absent  the last rank never calls loom_comm_split: the others must
 *           fail within LOOM_TIMEOUT (plus a second) with a message
 *           naming it.  "OK absent ms=T code=... msg=...".
 *   errors  the mistakes: NULL newcomm, a negative colour, NULL and stale
 *           handles, a bad cfg, a call inside a group; then a split that
 *           works.  "OK errors".
 *   late    a child of every rank; rank 1 sends to rank 0 and destroys
 *           its child at once, rank 2 does the same 0.3 s later; rank 0
 *           receives rank 2's message first (and meanwhile rank 1's and
 *           its goodbye), then rank 1's, which must still be there.
 *           "OK late".
 *   destroy even/odd children with a cfg; the parent destroyed, the
 *           children must go on (allreduce, allgather, sends).
 *           "OK destroy".
 * Every line of failure starts with FAIL and says why.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"
#include "fail.h"

static int rank, nranks;

/* The rule, written out independently of the library: the ranks of
 * colour c ordered by key, then rank. */
static int expect_members(const int *color, const int *key, int c, int *out)
{
    int k = 0;
    if (c < 0) return 0;
    for (int q = 0; q < nranks; q++)
        if (color[q] == c) out[k++] = q;
    for (int i = 1; i < k; i++) /* insertion sort */
        for (int j = i; j > 0; j--) {
            int a = out[j - 1], b = out[j];
            if (key[a] > key[b] || (key[a] == key[b] && a > b)) out[j - 1] = b, out[j] = a;
            else break;
        }
    return k;
}

/* Split by colour(q), key(q) and check the child against the rule. */
static loom_comm_t split_checked(loom_comm_t parent, const int *color, const int *key,
                                 int *members, int *k)
{
    loom_comm_t child = (loom_comm_t)1;
    CHECK(loom_comm_split(parent, color[rank], key[rank], NULL, &child));
    *k = expect_members(color, key, color[rank], members);
    if (color[rank] == LOOM_SPLIT_NOCOLOR) {
        if (child) FAIL("LOOM_SPLIT_NOCOLOR gave a communicator");
        return NULL;
    }
    if (!child) FAIL("no communicator for colour %d", color[rank]);
    int r, n;
    CHECK(loom_comm_rank(child, &r));
    CHECK(loom_comm_size(child, &n));
    if (n != *k) FAIL("colour %d: size %d, expected %d", color[rank], n, *k);
    if (members[r] != rank) FAIL("colour %d: rank %d in the child, expected member %d there", color[rank], r, members[r]);
    /* The child's ranks are the parent ranks in that order. */
    int *got = calloc((size_t)n, sizeof *got);
    CHECK(loom_allgather(&rank, got, 1, LOOM_INT32, child));
    for (int i = 0; i < n; i++)
        if (got[i] != members[i]) FAIL("child rank %d is parent rank %d, expected %d", i, got[i], members[i]);
    free(got);
    return child;
}

/* Traffic on a child of n ranks where this is rank r, checked: an
 * allreduce and a ring of sends. */
static void child_traffic(loom_comm_t child, const int *members, int salt)
{
    int r, n;
    CHECK(loom_comm_rank(child, &r));
    CHECK(loom_comm_size(child, &n));
    enum { N = 3000 };
    static int64_t a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = (int64_t)(members[r] + 1) * (i + salt);
    int64_t s = 0;
    for (int j = 0; j < n; j++) s += members[j] + 1;
    CHECK(loom_allreduce(a, b, N, LOOM_INT64, LOOM_SUM, child));
    for (int i = 0; i < N; i++)
        if (b[i] != s * (i + salt)) FAIL("child allreduce [%d] = %lld, expected %lld", i, (long long)b[i], (long long)(s * (i + salt)));
    if (n < 2) return;
    int to = (r + 1) % n, from = (r + n - 1) % n, out = members[r] * 1000 + salt, in = -1;
    loom_request_t q[2];
    CHECK(loom_irecv(&in, 1, LOOM_INT32, from, child, &q[0]));
    CHECK(loom_isend(&out, 1, LOOM_INT32, to, child, &q[1]));
    CHECK(loom_wait_all(q, 2));
    if (in != members[from] * 1000 + salt) FAIL("child recv from %d: %d", from, in);
}

static void parent_allreduce(loom_comm_t parent, int salt)
{
    enum { N = 2000 };
    static int32_t a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = rank * 3 + i + salt;
    CHECK(loom_allreduce(a, b, N, LOOM_INT32, LOOM_SUM, parent));
    const int32_t base = 3 * nranks * (nranks - 1) / 2;
    for (int i = 0; i < N; i++)
        if (b[i] != base + nranks * (i + salt)) FAIL("parent allreduce [%d] = %d", i, b[i]);
}

struct loop_arg {
    loom_comm_t c;
    const int *members;
    int child, iters;
};

static void *loop(void *p)
{
    struct loop_arg *a = p;
    for (int it = 0; it < a->iters; it++) {
        if (a->child) child_traffic(a->c, a->members, it);
        else parent_allreduce(a->c, it);
    }
    return NULL;
}

static int basic(loom_comm_t parent)
{
    int color[64], key[64], m1[64], m2[64], m3[64], k1, k2, k3;
    /* Even and odd. */
    for (int q = 0; q < nranks; q++) color[q] = q % 2, key[q] = q;
    loom_comm_t eo = split_checked(parent, color, key, m1, &k1);
    /* Pairs, keys reversing the order. */
    for (int q = 0; q < nranks; q++) color[q] = q / 2, key[q] = -q;
    loom_comm_t pair = split_checked(parent, color, key, m2, &k2);
    /* All but the last; equal keys: parent order. */
    for (int q = 0; q < nranks; q++) color[q] = q == nranks - 1 ? LOOM_SPLIT_NOCOLOR : 7, key[q] = 5;
    loom_comm_t most = split_checked(parent, color, key, m3, &k3);
    child_traffic(eo, m1, 1);
    child_traffic(pair, m2, 2);
    if (most) child_traffic(most, m3, 3);
    /* A split of a split: the even/odd child in one colour, keys
     * reversing its order; the grandchild's ranks are the child's
     * reversed, and its allreduce runs beside its parent's. */
    {
        int cr, cn;
        CHECK(loom_comm_rank(eo, &cr));
        CHECK(loom_comm_size(eo, &cn));
        loom_comm_t g;
        CHECK(loom_comm_split(eo, 0, -cr, NULL, &g));
        int gr, gn;
        CHECK(loom_comm_rank(g, &gr));
        CHECK(loom_comm_size(g, &gn));
        if (gn != cn || gr != cn - 1 - cr) FAIL("grandchild: rank %d of %d, child rank %d of %d", gr, gn, cr, cn);
        int gm[64];
        for (int i = 0; i < gn; i++) gm[i] = m1[gn - 1 - i];
        child_traffic(g, gm, 4);
        CHECK(loom_comm_destroy(g));
    }

    /* At once on one thread: the parent and two children. */
    for (int it = 0; it < 20; it++) {
        enum { N = 5000 };
        static float pa[N], pb[N], ca[N], cb[N];
        static int32_t ga[64 * 16], gb[16];
        for (int i = 0; i < N; i++) pa[i] = (float)(rank + it), ca[i] = (float)(rank * 2 + i % 7);
        for (int i = 0; i < 16; i++) gb[i] = rank * 100 + i + it;
        loom_request_t q[3];
        CHECK(loom_iallreduce(pa, pb, N, LOOM_FLOAT32, LOOM_SUM, parent, &q[0]));
        CHECK(loom_iallreduce(ca, cb, N, LOOM_FLOAT32, LOOM_SUM, eo, &q[1]));
        CHECK(loom_iallgather(gb, ga, 16, LOOM_INT32, pair, &q[2]));
        CHECK(loom_wait_all(q, 3));
        float ps = 0, cs = 0;
        for (int j = 0; j < nranks; j++) ps += (float)(j + it);
        for (int i = 0; i < N; i++) {
            cs = 0;
            for (int j = 0; j < k1; j++) cs += (float)(m1[j] * 2 + i % 7);
            if (pb[i] != ps || cb[i] != cs) FAIL("concurrent allreduce [%d]: parent %g (%g), child %g (%g)", i, pb[i], ps, cb[i], cs);
        }
        for (int j = 0; j < k2; j++)
            for (int i = 0; i < 16; i++)
                if (ga[j * 16 + i] != m2[j] * 100 + i + it) FAIL("concurrent allgather [%d][%d] = %d", j, i, ga[j * 16 + i]);
    }
    /* The parent and a child from two threads. */
    struct loop_arg pa = {parent, NULL, 0, 30}, ca = {eo, m1, 1, 30};
    pthread_t th;
    pthread_create(&th, NULL, loop, &ca);
    loop(&pa);
    pthread_join(th, NULL);
    CHECK(loom_comm_destroy(eo));
    CHECK(loom_comm_destroy(pair));
    if (most) CHECK(loom_comm_destroy(most));
    CHECK(loom_barrier(parent));
    printf("OK basic sizes=%d,%d,%d\n", k1, k2, k3);
    return 0;
}

static loom_comm_t even_odd(loom_comm_t parent, int *members, int *k)
{
    int color[64], key[64];
    for (int q = 0; q < nranks; q++) color[q] = q % 2, key[q] = q;
    return split_checked(parent, color, key, members, k);
}

static int abort_mode(loom_comm_t parent, int revoke)
{
    int m[64], k;
    loom_comm_t child = even_odd(parent, m, &k);
    child_traffic(child, m, 1);
    CHECK(loom_barrier(parent));
    const char *what = revoke ? "revoke" : "abort";
    if (rank == 0) {
        CHECK(revoke ? loom_comm_revoke(child) : loom_comm_abort(child));
        if (!revoke) child = NULL;
    } else if (rank % 2 == 0) {
        double t0 = now_ms();
        int64_t x = 1, y;
        loom_result_t r = loom_allreduce(&x, &y, 1, LOOM_INT64, LOOM_SUM, child);
        if (r == LOOM_SUCCESS) FAIL("the %sed child's allreduce succeeded", what);
        printf("E %s after %.0f ms: %s (%s)\n", what, now_ms() - t0, loom_strerror(r), loom_get_last_error());
    }
    /* The parent and the sibling are untouched. */
    for (int it = 0; it < 5; it++) parent_allreduce(parent, it);
    if (rank % 2 == 1)
        for (int it = 0; it < 5; it++) child_traffic(child, m, it);
    if (revoke && rank % 2 == 0) {
        loom_result_t r = loom_comm_get_error(child, NULL);
        if (r == LOOM_SUCCESS) FAIL("the revoked child has no error");
        loom_comm_t gc = (loom_comm_t)1;
        r = loom_comm_split(child, 0, 0, NULL, &gc);
        if (r != LOOM_ERR_REVOKED || gc) FAIL("split of a revoked communicator: %s", loom_strerror(r));
    }
    CHECK(loom_barrier(parent));
    if (child) CHECK(loom_comm_destroy(child));
    CHECK(loom_barrier(parent));
    printf("OK %s\n", what);
    return 0;
}

static int kill_mode(loom_comm_t parent, int victim)
{
    int m[64], k;
    loom_comm_t child = even_odd(parent, m, &k);
    child_traffic(child, m, 1);
    CHECK(loom_barrier(parent));
    /* Not before every rank is out of the barrier: a killed TCP peer's
     * last message can be lost with its connection. */
    if (rank == victim) {
        usleep(300000);
        raise(SIGKILL);
    }
    const int holds = rank % 2 == victim % 2; /* my child holds the victim */
    double t0 = now_ms() + 300, tp = -1, tc = -1; /* times from about the kill */
    for (int it = 0; it < 100000 && tp < 0; it++) {
        int32_t x = 1, y;
        if (loom_allreduce(&x, &y, 1, LOOM_INT32, LOOM_SUM, parent) != LOOM_SUCCESS)
            tp = now_ms() - t0;
    }
    if (tp < 0) FAIL("the parent never failed");
    char pmsg[160];
    snprintf(pmsg, sizeof pmsg, "%s", loom_get_last_error());
    if (holds) {
        for (int it = 0; it < 100000 && tc < 0; it++) {
            int32_t x = 1, y;
            if (loom_allreduce(&x, &y, 1, LOOM_INT32, LOOM_SUM, child) != LOOM_SUCCESS)
                tc = now_ms() - t0;
        }
        if (tc < 0) FAIL("the child holding rank %d never failed", victim);
        printf("OK kill parent_ms=%.0f child_ms=%.0f (%.60s)\n", tp, tc, pmsg);
    } else {
        for (int it = 0; it < 10; it++) child_traffic(child, m, it);
        printf("OK kill parent_ms=%.0f sibling=ok (%.60s)\n", tp, pmsg);
    }
    loom_comm_destroy(child);
    loom_comm_destroy(parent);
    return 0;
}

static void *killer(void *arg)
{
    usleep((useconds_t)(uintptr_t)arg);
    raise(SIGKILL);
    return NULL;
}

static int killsplit(loom_comm_t parent, int victim)
{
    srand((unsigned)getpid());
    CHECK(loom_barrier(parent));
    if (rank == victim) {
        pthread_t th;
        pthread_create(&th, NULL, killer, (void *)(uintptr_t)(rand() % 400000));
    }
    double t0 = now_ms();
    int done = 0;
    loom_result_t r = LOOM_SUCCESS;
    for (int it = 0; it < 1000; it++) {
        loom_comm_t c = (loom_comm_t)1;
        r = loom_comm_split(parent, rank % 2, rank, NULL, &c);
        if (r != LOOM_SUCCESS) {
            if (c) FAIL("*newcomm set after an error");
            break;
        }
        int32_t x = 1, y;
        (void)loom_allreduce(&x, &y, 1, LOOM_INT32, LOOM_SUM, c); /* may see the death */
        CHECK(loom_comm_destroy(c));
        done++;
    }
    if (r == LOOM_SUCCESS) FAIL("1000 splits and the death of rank %d never seen", victim);
    printf("OK killsplit after %d splits, %.0f ms: %s (%.100s)\n", done, now_ms() - t0,
           loom_strerror(r), loom_get_last_error());
    return 0;
}

/* The last rank makes another collective call where the others split:
 * every rank fails, none hangs, and the message names the calls. */
static int othercall(loom_comm_t parent)
{
    const int last = nranks - 1;
    loom_result_t r;
    /* Every rank out of its creation (and of the barrier) first: a rank
     * still finishing an earlier call fails there when the others' calls
     * differ. */
    CHECK(loom_barrier(parent));
    double t0 = now_ms();
    if (rank == last) {
        usleep(200000);
        float x[5] = {0}, y[5];
        r = loom_allreduce(x, y, 5, LOOM_FLOAT32, LOOM_SUM, parent);
    } else {
        loom_comm_t c = (loom_comm_t)1;
        r = loom_comm_split(parent, 0, 0, NULL, &c);
        if (c) FAIL("*newcomm set after an error");
    }
    if (r == LOOM_SUCCESS) FAIL("the call succeeded");
    printf("OK othercall ms=%.0f code=%s msg=%.200s\n", now_ms() - t0, loom_strerror(r),
           loom_get_last_error());
    loom_comm_abort(parent);
    return 0;
}

static int absent(loom_comm_t parent, int timeout_ms)
{
    const int last = nranks - 1;
    if (rank == last) {
        usleep((useconds_t)(timeout_ms + 3000) * 1000);
        printf("OK absent (the rank that stayed away)\n");
        loom_comm_abort(parent);
        return 0;
    }
    loom_comm_t child = (loom_comm_t)1;
    double t0 = now_ms();
    loom_result_t r = loom_comm_split(parent, rank % 2, rank, NULL, &child);
    double t = now_ms() - t0;
    if (r == LOOM_SUCCESS || child) FAIL("split without rank %d succeeded", last);
    char want[32];
    snprintf(want, sizeof want, "rank %d", last);
    if (!strstr(loom_get_last_error(), want)) FAIL("the message does not name %s", want);
    if (t > timeout_ms + 1500) FAIL("failed after %.0f ms, LOOM_TIMEOUT %d", t, timeout_ms);
    printf("OK absent ms=%.0f code=%s msg=%.200s\n", t, loom_strerror(r), loom_get_last_error());
    loom_comm_abort(parent);
    return 0;
}

static int errors(loom_comm_t parent)
{
    loom_comm_t c = (loom_comm_t)1;
    EXPECT(loom_comm_split(parent, 0, 0, NULL, NULL), LOOM_ERR_INVALID_ARGUMENT, "newcomm");
    EXPECT(loom_comm_split(parent, -2, 0, NULL, &c), LOOM_ERR_INVALID_ARGUMENT, "color -2");
    if (c) FAIL("*newcomm not NULL after an error");
    EXPECT(loom_comm_split(NULL, 0, 0, NULL, &c), LOOM_ERR_INVALID_ARGUMENT, "comm is NULL");
    loom_config_t bad;
    loom_config_init(&bad);
    bad.size = 3;
    EXPECT(loom_comm_split(parent, 0, 0, &bad, &c), LOOM_ERR_INVALID_ARGUMENT, "cfg->size");
    loom_config_init(&bad);
    bad.algo = "allreduce:nosuch";
    EXPECT(loom_comm_split(parent, 0, 0, &bad, &c), LOOM_ERR_INVALID_ARGUMENT, "nosuch");
    CHECK(loom_group_start());
    EXPECT(loom_comm_split(parent, 0, 0, NULL, &c), LOOM_ERR_INVALID_USAGE, "loom_group_start");
    CHECK(loom_group_end());
    /* None of these broke the parent: a split works, and a stale handle
     * is refused. */
    loom_config_t cfg;
    loom_config_init(&cfg);
    cfg.timeout_ms = 9000;
    loom_comm_t child;
    CHECK(loom_comm_split(parent, 0, nranks - rank, &cfg, &child));
    int r, n;
    CHECK(loom_comm_rank(child, &r));
    CHECK(loom_comm_size(child, &n));
    if (n != nranks || r != nranks - 1 - rank) FAIL("rank %d of %d in the child", r, n);
    CHECK(loom_comm_destroy(child));
    EXPECT(loom_comm_split(child, 0, 0, NULL, &c), LOOM_ERR_INVALID_ARGUMENT, "not a live");
    CHECK(loom_barrier(parent));
    printf("OK errors\n");
    return 0;
}

/* A rank that sends and at once destroys its communicator: the peer's
 * receive, posted later, still gets the message (on a child, whose
 * members come and go while the parent stays). */
static int late(loom_comm_t parent)
{
    loom_comm_t child;
    CHECK(loom_comm_split(parent, 0, rank, NULL, &child));
    int v = 1000 + rank, got = -1;
    if (rank == 1) {
        CHECK(loom_send(&v, 1, LOOM_INT32, 0, child));
        CHECK(loom_comm_destroy(child));
    } else if (rank == 2) {
        usleep(300000);
        CHECK(loom_send(&v, 1, LOOM_INT32, 0, child));
        CHECK(loom_comm_destroy(child));
    } else if (rank == 0) {
        /* Waiting for rank 2 reads rank 1's message and its goodbye. */
        CHECK(loom_recv(&got, 1, LOOM_INT32, 2, child));
        CHECK(loom_recv(&got, 1, LOOM_INT32, 1, child));
        if (got != 1001) FAIL("received %d from the departed rank 1", got);
        CHECK(loom_comm_destroy(child));
    } else {
        CHECK(loom_comm_destroy(child));
    }
    CHECK(loom_barrier(parent));
    printf("OK late\n");
    return 0;
}

static int destroy_mode(loom_comm_t parent)
{
    int m[64], k;
    loom_comm_t child = even_odd(parent, m, &k);
    CHECK(loom_comm_destroy(parent));
    for (int it = 0; it < 10; it++) child_traffic(child, m, it);
    int32_t g[64];
    CHECK(loom_allgather(&rank, g, 1, LOOM_INT32, child));
    for (int i = 0; i < k; i++)
        if (g[i] != m[i]) FAIL("allgather after the parent went: [%d] = %d", i, g[i]);
    CHECK(loom_barrier(child));
    CHECK(loom_comm_destroy(child));
    printf("OK destroy\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mp_split basic|abort|revoke|kill|absent|errors|destroy [VICTIM]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argv[1];
    loom_comm_t comm;
    fail_join(&comm, &rank, &nranks);
    if (nranks > 64) FAIL("at most 64 ranks");
    int rc = 2;
    if (!strcmp(mode, "basic")) rc = basic(comm);
    else if (!strcmp(mode, "abort")) rc = abort_mode(comm, 0);
    else if (!strcmp(mode, "revoke")) rc = abort_mode(comm, 1);
    else if (!strcmp(mode, "kill")) return kill_mode(comm, argc > 2 ? atoi(argv[2]) : 3);
    else if (!strcmp(mode, "killsplit")) return killsplit(comm, argc > 2 ? atoi(argv[2]) : 3);
    else if (!strcmp(mode, "late")) rc = late(comm);
    else if (!strcmp(mode, "othercall")) return othercall(comm);
    else if (!strcmp(mode, "absent")) return absent(comm, argc > 2 ? atoi(argv[2]) : 3000);
    else if (!strcmp(mode, "errors")) rc = errors(comm);
    else if (!strcmp(mode, "destroy")) return destroy_mode(comm);
    if (rc == 0) loom_comm_destroy(comm);
    return rc;
}
