/*
 * mp_cgroup.c - one rank of the loom_comm_create_group tests
 * (test_create_group.sh), 4 ranks.
 *
 * usage: mp_cgroup MODE
 *   basic     {1,0} (listed in that order) and {2,3} at once; then
 *             {0,2,3} while rank 1 stays out and calls nothing; then the
 *             whole list twice (two distinct communicators, used at once);
 *             each child's rank, size, allgather of parent ranks (the
 *             list's order) and allreduce checked exactly; the parent
 *             still works.  "OK basic ...".
 *   mismatch  ranks 0, 1, 2 create {0,1,2} but rank 2 lists {0,2,1}, then
 *             rank 1 passes tag 9: every member fails fast naming the
 *             culprit (LOOM_ERR_MISMATCH); rank 3 takes no part.  Then
 *             {0,1,2} right: it works.  "OK mismatch ...".
 *   notin     ranks 0 and 2 create {0,1,2}, rank 1 lists {0,2}: rank 1
 *             fails with LOOM_ERR_INVALID_ARGUMENT, 0 and 2 fast naming
 *             rank 1.  "OK notin ...".
 *   absent    ranks 0 and 1 create {0,1,2}; rank 2 never calls: both fail
 *             with LOOM_ERR_TIMEOUT naming rank 2 within LOOM_TIMEOUT
 *             (+1.5 s).  "OK absent ...".
 *   kill      {0,1} and {2,3} made; rank 3 SIGKILLed: {2,3} fails on rank
 *             2, {0,1} goes on exactly; ranks 1 and 2 then create
 *             {1,2,3}: it fails naming rank 3; the survivors shrink the
 *             parent and allreduce on it exactly.  "OK kill ...".
 *   errors    NULL newcomm, n 0 and too big, NULL ranks, a rank out of
 *             range, a repeated rank, a negative tag (every rank the same
 *             mistake), then a create that works.  "OK errors".
 * Every line of failure starts with FAIL and says why.
 */
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

static int index_of(const int *l, int n, int q)
{
    for (int i = 0; i < n; i++)
        if (l[i] == q) return i;
    return -1;
}

/* c is the group of list l (n ranks): rank, size, an allgather of parent
 * ranks in list order, an allreduce of (parent rank + 1) * salt. */
static void check_child(loom_comm_t c, const int *l, int n, int salt)
{
    int cr, cn;
    CHECK(loom_comm_rank(c, &cr));
    CHECK(loom_comm_size(c, &cn));
    if (cn != n || cr != index_of(l, n, rank))
        FAIL("rank %d size %d in the group, expected %d of %d", cr, cn, index_of(l, n, rank), n);
    int32_t me = rank, all[64];
    CHECK(loom_allgather(&me, all, 1, LOOM_INT32, c));
    for (int i = 0; i < n; i++)
        if (all[i] != l[i]) FAIL("allgather[%d] = %d, expected %d", i, all[i], l[i]);
    int64_t x[3] = {(rank + 1) * salt, 1, -rank}, y[3], want = 0, wneg = 0;
    for (int i = 0; i < n; i++) {
        want += (l[i] + 1) * salt;
        wneg -= l[i];
    }
    CHECK(loom_allreduce(x, y, 3, LOOM_INT64, LOOM_SUM, c));
    if (y[0] != want || y[1] != n || y[2] != wneg)
        FAIL("allreduce gave %lld %lld %lld, expected %lld %d %lld", (long long)y[0],
             (long long)y[1], (long long)y[2], (long long)want, n, (long long)wneg);
}

static void parent_ok(loom_comm_t p, int n)
{
    int32_t x = 1, y = 0;
    CHECK(loom_allreduce(&x, &y, 1, LOOM_INT32, LOOM_SUM, p));
    if (y != n) FAIL("the parent's allreduce gave %d, expected %d", y, n);
}

static int basic(loom_comm_t p)
{
    static const int a[2] = {1, 0}, b[2] = {2, 3}, o[3] = {0, 2, 3}, w[4] = {0, 1, 2, 3};
    double t0 = now_ms();
    /* Disjoint, at once. */
    loom_comm_t c = NULL;
    const int *mine = rank < 2 ? a : b;
    CHECK(loom_comm_create_group(p, 2, mine, 1, &c));
    if (!c) FAIL("no communicator");
    check_child(c, mine, 2, 3);
    double t1 = now_ms();
    /* Overlapping, rank 1 out and idle. */
    loom_comm_t d = NULL;
    if (rank != 1) {
        CHECK(loom_comm_create_group(p, 3, o, 2, &d));
        check_child(d, o, 3, 5);
        check_child(c, mine, 2, 7); /* the first still right beside it */
    } else {
        usleep(200000); /* nothing: the others do not wait for this rank */
        check_child(c, mine, 2, 7);
    }
    double t2 = now_ms();
    /* The same list twice: two communicators, used at once. */
    loom_comm_t e1 = NULL, e2 = NULL;
    CHECK(loom_comm_create_group(p, 4, w, 3, &e1));
    CHECK(loom_comm_create_group(p, 4, w, 3, &e2));
    if (!e1 || !e2 || e1 == e2) FAIL("the same list twice gave %p and %p", (void *)e1, (void *)e2);
    int32_t x1 = rank, x2 = 10 * rank, y1, y2;
    loom_request_t r1, r2;
    CHECK(loom_iallreduce(&x1, &y1, 1, LOOM_INT32, LOOM_SUM, e1, &r1));
    CHECK(loom_iallreduce(&x2, &y2, 1, LOOM_INT32, LOOM_SUM, e2, &r2));
    CHECK(loom_wait(&r2));
    CHECK(loom_wait(&r1));
    if (y1 != 6 || y2 != 60) FAIL("the twins gave %d and %d, expected 6 and 60", y1, y2);
    check_child(e2, w, 4, 11);
    check_child(e1, w, 4, 13);
    parent_ok(p, nranks);
    CHECK(loom_comm_destroy(e1));
    CHECK(loom_comm_destroy(e2));
    if (d) CHECK(loom_comm_destroy(d));
    CHECK(loom_comm_destroy(c));
    parent_ok(p, nranks);
    printf("OK basic disjoint_ms=%.0f overlap_ms=%.0f\n", t1 - t0, t2 - t1);
    return 0;
}

static int mismatch(loom_comm_t p)
{
    static const int l[3] = {0, 1, 2}, swapped[3] = {0, 2, 1};
    char msg[3][400] = {{0}};
    double worst = 0;
    if (rank < 3) {
        for (int round = 0; round < 2; round++) {
            const int *mine = round == 0 && rank == 2 ? swapped : l;
            int tag = round == 1 && rank == 1 ? 9 : 4;
            const int culprit = round == 0 ? 2 : 1;
            loom_comm_t c = (loom_comm_t)1;
            double t0 = now_ms();
            loom_result_t r = loom_comm_create_group(p, 3, mine, tag, &c);
            double t = now_ms() - t0;
            if (r != LOOM_ERR_MISMATCH || c)
                FAIL("round %d: gave %s (newcomm %p), expected LOOM_ERR_MISMATCH", round,
                     loom_strerror(r), (void *)c);
            char want[32];
            snprintf(want, sizeof want, "rank %d", culprit);
            snprintf(msg[round], sizeof msg[round], "%s", loom_get_last_error());
            if (rank != culprit && !strstr(msg[round], want))
                FAIL("round %d: the message does not name %s", round, want);
            if (t > 3000) FAIL("round %d: took %.0f ms", round, t);
            if (t > worst) worst = t;
        }
        loom_comm_t c = NULL;
        CHECK(loom_comm_create_group(p, 3, l, 4, &c));
        check_child(c, l, 3, 17);
        CHECK(loom_comm_destroy(c));
    }
    CHECK(loom_barrier(p));
    parent_ok(p, nranks);
    printf("OK mismatch ms=%.0f list: %.150s | tag: %.150s\n", worst, msg[0], msg[1]);
    return 0;
}

static int notin(loom_comm_t p)
{
    static const int l[3] = {0, 1, 2}, bad[2] = {0, 2};
    CHECK(loom_barrier(p)); /* every rank out of its init first */
    if (rank < 3) {
        loom_comm_t c = (loom_comm_t)1;
        double t0 = now_ms();
        loom_result_t r = loom_comm_create_group(p, rank == 1 ? 2 : 3, rank == 1 ? bad : l, 4, &c);
        double t = now_ms() - t0;
        if (r != LOOM_ERR_INVALID_ARGUMENT || c)
            FAIL("gave %s, expected LOOM_ERR_INVALID_ARGUMENT", loom_strerror(r));
        if (!strstr(loom_get_last_error(), "rank 1")) FAIL("the message does not name rank 1");
        if (t > 3000) FAIL("took %.0f ms", t);
        printf("OK notin ms=%.0f msg=%.200s\n", t, loom_get_last_error());
        usleep(1500000); /* not gone before the others heard it */
    } else {
        usleep(2000000); /* not gone while the others use comm */
        printf("OK notin (not listed)\n");
    }
    loom_comm_abort(p);
    return 0;
}

static int absent(loom_comm_t p)
{
    static const int l[3] = {0, 1, 2};
    const char *tv = getenv("LOOM_TIMEOUT");
    const int tmo = tv ? atoi(tv) : 30000;
    if (rank >= 2) {
        usleep((useconds_t)(tmo + 3000) * 1000);
        printf("OK absent (stayed away)\n");
        loom_comm_abort(p);
        return 0;
    }
    loom_comm_t c = (loom_comm_t)1;
    double t0 = now_ms();
    loom_result_t r = loom_comm_create_group(p, 3, l, 0, &c);
    double t = now_ms() - t0;
    if (r != LOOM_ERR_TIMEOUT || c) FAIL("gave %s, expected LOOM_ERR_TIMEOUT", loom_strerror(r));
    if (!strstr(loom_get_last_error(), "rank 2")) FAIL("the message does not name rank 2");
    if (t > tmo + 1500) FAIL("failed after %.0f ms, LOOM_TIMEOUT %d", t, tmo);
    printf("OK absent ms=%.0f msg=%.200s\n", t, loom_get_last_error());
    usleep(1000000); /* not gone before the other member timed out too */
    loom_comm_abort(p);
    return 0;
}

static int kill_mode(loom_comm_t p)
{
    static const int a[2] = {0, 1}, b[2] = {2, 3}, t3[3] = {1, 2, 3};
    const int *mine = rank < 2 ? a : b;
    loom_comm_t c = NULL;
    CHECK(loom_comm_create_group(p, 2, mine, 0, &c));
    check_child(c, mine, 2, 1);
    CHECK(loom_barrier(p));
    if (rank == 3) {
        usleep(200000); /* the others out of the barrier too */
        raise(SIGKILL);
    }
    double t0 = now_ms();
    char why[200] = "";
    if (rank == 2) {
        double tc = -1;
        for (int it = 0; it < 1000000 && tc < 0; it++) {
            int32_t x = 1, y;
            if (loom_allreduce(&x, &y, 1, LOOM_INT32, LOOM_SUM, c) != LOOM_SUCCESS)
                tc = now_ms() - t0;
        }
        if (tc < 0) FAIL("the group holding rank 3 never failed");
        snprintf(why, sizeof why, "child_ms=%.0f", tc);
    } else {
        for (int it = 0; it < 50; it++) {
            check_child(c, a, 2, it + 1);
            usleep(10000); /* past rank 3's death on the control plane */
        }
        snprintf(why, sizeof why, "sibling=ok");
    }
    if (rank >= 1) { /* a create with the dead rank in it */
        loom_comm_t d = (loom_comm_t)1;
        double t1 = now_ms();
        loom_result_t r = loom_comm_create_group(p, 3, t3, 1, &d);
        if (r == LOOM_SUCCESS || d) FAIL("a create with killed rank 3 succeeded");
        if (!strstr(loom_get_last_error(), "rank 3")) FAIL("the message does not name rank 3");
        snprintf(why + strlen(why), sizeof why - strlen(why), " create_ms=%.0f",
                 now_ms() - t1);
    }
    /* The parent, which holds the dead rank: the survivors shrink it. */
    loom_comm_t s = NULL;
    CHECK(loom_comm_shrink(p, &s));
    parent_ok(s, 3);
    CHECK(loom_comm_destroy(s));
    CHECK(loom_comm_destroy(c));
    printf("OK kill %s parent_shrunk=ok\n", why);
    loom_comm_abort(p);
    return 0;
}

static int errors(loom_comm_t p)
{
    static const int l[4] = {0, 1, 2, 3}, dup[3] = {0, 1, 1}, far[2] = {0, 99};
    loom_comm_t c = (loom_comm_t)1;
    EXPECT(loom_comm_create_group(p, 4, l, 0, NULL), LOOM_ERR_INVALID_ARGUMENT, "newcomm");
    EXPECT(loom_comm_create_group(p, 0, l, 0, &c), LOOM_ERR_INVALID_ARGUMENT, "n = 0");
    if (c) FAIL("*newcomm not NULL after an error");
    EXPECT(loom_comm_create_group(p, 5, l, 0, &c), LOOM_ERR_INVALID_ARGUMENT, "n = 5");
    EXPECT(loom_comm_create_group(p, 4, NULL, 0, &c), LOOM_ERR_INVALID_ARGUMENT, "ranks is NULL");
    EXPECT(loom_comm_create_group(NULL, 4, l, 0, &c), LOOM_ERR_INVALID_ARGUMENT, "");
    /* Mistakes found before anything is sent. */
    EXPECT(loom_comm_create_group(p, 3, dup, 0, &c), LOOM_ERR_INVALID_ARGUMENT, "ranks[2] = 1 repeats ranks[1]");
    EXPECT(loom_comm_create_group(p, 2, far, 0, &c), LOOM_ERR_INVALID_ARGUMENT, "ranks[1] = 99");
    EXPECT(loom_comm_create_group(p, 4, l, -2, &c), LOOM_ERR_INVALID_ARGUMENT, "tag -2");
    if (c) FAIL("*newcomm not NULL after an error");
    loom_group_start();
    EXPECT(loom_comm_create_group(p, 4, l, 0, &c), LOOM_ERR_INVALID_USAGE, "loom_group_start");
    loom_group_end();
    CHECK(loom_comm_create_group(p, 4, l, 0, &c));
    check_child(c, l, 4, 19);
    CHECK(loom_comm_destroy(c));
    printf("OK errors\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mp_cgroup basic|mismatch|notin|absent|kill|errors\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argv[1];
    loom_comm_t comm;
    fail_join(&comm, &rank, &nranks);
    if (nranks != 4) FAIL("4 ranks, not %d", nranks);
    if (!strcmp(mode, "basic")) basic(comm);
    else if (!strcmp(mode, "mismatch")) mismatch(comm);
    else if (!strcmp(mode, "notin")) return notin(comm);
    else if (!strcmp(mode, "absent")) return absent(comm);
    else if (!strcmp(mode, "kill")) return kill_mode(comm);
    else if (!strcmp(mode, "errors")) errors(comm);
    else return 2;
    loom_comm_destroy(comm);
    return 0;
}
