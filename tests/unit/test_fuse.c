/*
 * test_fuse.c - the fusion rule of loom_group_end (comm/group.c): which
 * calls may fuse, how the queued calls are bucketed (same communicator,
 * collective, datatype and op; op ignored for allgather; a byte cap per
 * bucket; buckets numbered by first appearance), the hash of the members'
 * counts, and the fused descriptor's text; and, on a one-rank
 * communicator, groups whose calls fuse give each call its own result.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/calls.h"
#include "comm/group.h"
#include "loom.h"

#define AR LOOMI_COLL_ALLREDUCE
#define RS LOOMI_COLL_REDUCE_SCATTER
#define AG LOOMI_COLL_ALLGATHER

Test(fuse, eligible)
{
    /* The three collectives, up to LOOMI_FUSE_MEMBER_MAX staging bytes. */
    cr_assert(loomi_fuse_eligible(AR, 1024, 4, 4));
    cr_assert(loomi_fuse_eligible(AR, LOOMI_FUSE_MEMBER_MAX / 4, 4, 4));
    cr_assert(!loomi_fuse_eligible(AR, LOOMI_FUSE_MEMBER_MAX / 4 + 1, 4, 4));
    /* Reduce-scatter and allgather stage nranks blocks. */
    cr_assert(loomi_fuse_eligible(RS, LOOMI_FUSE_MEMBER_MAX / 16, 4, 4));
    cr_assert(!loomi_fuse_eligible(RS, LOOMI_FUSE_MEMBER_MAX / 16 + 1, 4, 4));
    cr_assert(!loomi_fuse_eligible(AG, LOOMI_FUSE_MEMBER_MAX / 16 + 1, 4, 4));
    cr_assert(loomi_fuse_eligible(AG, 1, 2, 64));
    /* Nothing else, nor empty calls, nor counts whose bytes overflow. */
    cr_assert(!loomi_fuse_eligible(LOOMI_COLL_BROADCAST, 16, 4, 4));
    cr_assert(!loomi_fuse_eligible(LOOMI_COLL_ALLTOALL, 16, 4, 4));
    cr_assert(!loomi_fuse_eligible(LOOMI_COLL_REDUCE, 16, 4, 4));
    cr_assert(!loomi_fuse_eligible(AR, 0, 4, 4));
    cr_assert(!loomi_fuse_eligible(AR, SIZE_MAX / 2, 8, 4));
    cr_assert(!loomi_fuse_eligible(RS, SIZE_MAX / 8, 8, 1 << 20));
}

static struct loomi_fuse_item item(uintptr_t comm, int coll, loom_datatype_t t, loom_op_t op,
                                   size_t bytes)
{
    struct loomi_fuse_item it = {comm, coll, t, op, bytes};
    return it;
}

Test(fuse, plan)
{
    struct loomi_fuse_item it[] = {
        item(1, AR, LOOM_FLOAT32, LOOM_SUM, 100),  /* 0: bucket 0 */
        item(1, AR, LOOM_FLOAT64, LOOM_SUM, 100),  /* 1: another datatype: 1 */
        item(1, AR, LOOM_FLOAT32, LOOM_MAX, 100),  /* 2: another op: 2 */
        item(2, AR, LOOM_FLOAT32, LOOM_SUM, 100),  /* 3: another communicator: 3 */
        item(1, RS, LOOM_FLOAT32, LOOM_SUM, 100),  /* 4: another collective: 4 */
        item(1, AR, LOOM_FLOAT32, LOOM_SUM, 100),  /* 5: with 0 */
        item(1, AG, LOOM_FLOAT32, LOOM_SUM, 100),  /* 6: 5 */
        item(1, AG, LOOM_FLOAT32, LOOM_MAX, 100),  /* 7: allgather's op does not count: 5 */
        item(1, AG, LOOM_INT32, LOOM_SUM, 100),    /* 8: but its datatype does: 6 */
        item(1, AR, LOOM_FLOAT64, LOOM_SUM, 100),  /* 9: with 1 */
        item(1, AR, LOOM_FLOAT32, LOOM_SUM, 900),  /* 10: 0 is full (1000 max): 7 */
        item(1, AR, LOOM_FLOAT32, LOOM_SUM, 50),   /* 11: with 10 (0 stays closed) */
        item(1, AR, LOOM_FLOAT32, LOOM_SUM, 5000), /* 12: alone past the cap: 8 */
        item(1, AR, LOOM_FLOAT32, LOOM_SUM, 10),   /* 13: a new one after it: 9 */
    };
    const uint32_t want[] = {0, 1, 2, 3, 4, 0, 5, 5, 6, 1, 7, 7, 8, 9};
    const size_t n = sizeof it / sizeof it[0];
    uint32_t got[sizeof it / sizeof it[0]];
    cr_assert_eq(loomi_fuse_plan(it, n, 1000, got), 10);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "item %zu: bucket %u, want %u", i, got[i], want[i]);
    /* Every item of one kind under the cap: one bucket. */
    struct loomi_fuse_item same[1000];
    uint32_t b[1000];
    for (int i = 0; i < 1000; i++) same[i] = item(7, AR, LOOM_FLOAT32, LOOM_SUM, 4096);
    cr_assert_eq(loomi_fuse_plan(same, 1000, LOOMI_FUSE_BUCKET_MAX, b), 1);
    for (int i = 0; i < 1000; i++) cr_assert_eq(b[i], 0);
    /* A cap of 10 items' bytes: 100 buckets of 10, in order. */
    cr_assert_eq(loomi_fuse_plan(same, 1000, 40960, b), 100);
    for (int i = 0; i < 1000; i++) cr_assert_eq(b[i], (uint32_t)(i / 10));
}

Test(fuse, shape)
{
    size_t a[] = {1, 2, 3}, b[] = {2, 1, 3}, c[] = {1, 2, 3, 0}, d[] = {1, 2, 4};
    uint32_t h = loomi_fuse_shape(a, 3);
    cr_assert_neq(h, 0);
    cr_assert_eq(h, loomi_fuse_shape(a, 3));
    cr_assert_neq(h, loomi_fuse_shape(b, 3), "order counts");
    cr_assert_neq(h, loomi_fuse_shape(c, 4), "the number of calls counts");
    cr_assert_neq(h, loomi_fuse_shape(d, 3), "every count counts");
}

Test(fuse, descriptor)
{
    struct loomi_call f = loomi_call_make_fused(AR, 4096000, LOOM_FLOAT32, LOOM_SUM, 1000, 0x1234);
    struct loomi_call p = loomi_call_make(AR, 4096000, LOOM_FLOAT32, LOOM_SUM, 0, 0);
    struct loomi_call g = loomi_call_make_fused(AR, 4096000, LOOM_FLOAT32, LOOM_SUM, 999, 0x1234);
    struct loomi_call h = loomi_call_make_fused(AR, 4096000, LOOM_FLOAT32, LOOM_SUM, 1000, 0x1235);
    cr_assert_neq(loomi_call_check(&f), loomi_call_check(&p), "fused differs from one call");
    cr_assert_neq(loomi_call_check(&f), loomi_call_check(&g), "the member count is checked");
    cr_assert_neq(loomi_call_check(&f), loomi_call_check(&h), "the counts' hash is checked");
    char s[256];
    loomi_call_str(&f, s, sizeof s);
    cr_assert(strstr(s, "1000 fused loom_allreduce calls") && strstr(s, "count=4096000 in all") &&
                  strstr(s, "float32") && strstr(s, "sum") && strstr(s, "00001234"),
              "%s", s);
    struct loomi_call a = loomi_call_make_fused(AG, 10, LOOM_INT32, LOOM_MAX, 2, 7);
    loomi_call_str(&a, s, sizeof s);
    cr_assert(strstr(s, "2 fused loom_allgather calls") && strstr(s, "sendcount=10 in all") &&
                  !strstr(s, "max"),
              "%s", s);
}

/* One rank: the fused group's results are each call's own (a copy, or
 * the op applied to one contribution), mixed with calls that do not
 * fuse. */
Test(fuse, one_rank)
{
    setenv("LOOM_DEBUG", "none", 1);
    loom_unique_id_t id;
    loom_comm_t comm;
    cr_assert_eq(loom_get_unique_id(&id), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_init_rank(&comm, 1, &id, 0, NULL), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    enum { K = 50 };
    float in[K][8], out[K][8], view[K * 8];
    double d[3] = {1, 2, 3}, dout[3] = {0};
    int32_t bc[4] = {4, 5, 6, 7};
    for (int k = 0; k < K; k++)
        for (int j = 0; j < 8; j++) in[k][j] = (float)(k * 8 + j), out[k][j] = -1, view[k * 8 + j] = (float)(k + j);
    cr_assert_eq(loom_group_start(), LOOM_SUCCESS);
    for (int k = 0; k < K; k++) {
        cr_assert_eq(loom_allreduce(in[k], out[k], 1 + (size_t)k % 8, LOOM_FLOAT32,
                                    k % 2 ? LOOM_MAX : LOOM_SUM, comm),
                     LOOM_SUCCESS, "%s", loom_get_last_error());
        cr_assert_eq(loom_allreduce(view + k * 8, view + k * 8, 8, LOOM_FLOAT32, LOOM_SUM, comm),
                     LOOM_SUCCESS);
    }
    cr_assert_eq(loom_allreduce(d, dout, 3, LOOM_FLOAT64, LOOM_PROD, comm), LOOM_SUCCESS);
    cr_assert_eq(loom_broadcast(bc, bc, 4, LOOM_INT32, 0, comm), LOOM_SUCCESS);
    /* Nothing ran yet. */
    cr_assert_eq(out[3][0], -1);
    cr_assert_eq(dout[0], 0);
    cr_assert_eq(loom_group_end(), LOOM_SUCCESS, "%s", loom_get_last_error());
    for (int k = 0; k < K; k++)
        for (int j = 0; j < 8; j++) {
            float want = j < 1 + k % 8 ? (float)(k * 8 + j) : -1;
            cr_assert_eq(out[k][j], want, "call %d [%d] = %g, want %g", k, j, out[k][j], want);
            cr_assert_eq(view[k * 8 + j], (float)(k + j));
        }
    cr_assert(dout[0] == 1 && dout[1] == 2 && dout[2] == 3);
    cr_assert(bc[0] == 4 && bc[3] == 7);
    /* Non-blocking calls are still refused in a group. */
    loom_request_t req;
    cr_assert_eq(loom_group_start(), LOOM_SUCCESS);
    cr_assert_eq(loom_iallreduce(in[0], out[0], 1, LOOM_FLOAT32, LOOM_SUM, comm, &req),
                 LOOM_ERR_INVALID_USAGE);
    cr_assert_eq(loom_group_end(), LOOM_SUCCESS);
    /* A communicator destroyed before loom_group_end: its queued calls
     * fail there, naming it, and touch no buffer. */
    loom_comm_t c2;
    cr_assert_eq(loom_get_unique_id(&id), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_init_rank(&c2, 1, &id, 0, NULL), LOOM_SUCCESS);
    out[0][0] = out[1][0] = -1;
    cr_assert_eq(loom_group_start(), LOOM_SUCCESS);
    cr_assert_eq(loom_allreduce(in[0], out[0], 1, LOOM_FLOAT32, LOOM_SUM, c2), LOOM_SUCCESS);
    cr_assert_eq(loom_allreduce(in[1], out[1], 1, LOOM_FLOAT32, LOOM_SUM, c2), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_destroy(c2), LOOM_SUCCESS);
    loom_result_t r = loom_group_end();
    cr_assert_eq(r, LOOM_ERR_INVALID_ARGUMENT, "%d: %s", r, loom_get_last_error());
    cr_assert(strstr(loom_get_last_error(), "loom_group_end") &&
                  strstr(loom_get_last_error(), "not a live communicator"),
              "%s", loom_get_last_error());
    cr_assert(out[0][0] == -1 && out[1][0] == -1);
    cr_assert_eq(loom_comm_destroy(comm), LOOM_SUCCESS);
}
