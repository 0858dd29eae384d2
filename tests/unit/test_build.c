/*
 * test_build.c - the schedule builder (src/coll/build.h) derives each
 * step's dependencies from the byte ranges it reads and writes: read
 * after write, write after read, write after write; ranges that share no
 * byte get none; and it cuts a message into chunks by the one rule.
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "coll/build.h"
#include "coll/coll.h"

static struct loomi_sched S;
static struct loomi_build B;

/* A rank of 4 with 1 KiB buffers of floats (4 bytes); chunks of 64 B. */
static void setup(void)
{
    loomi_sched_init(&S, 0, 4, LOOM_FLOAT32, LOOM_SUM);
    for (int b = 0; b < LOOMI_NBUFS; b++) S.buf_bytes[b] = 1024;
    cr_assert_eq(loomi_build_init(&B, &S, 1024, 64), LOOM_SUCCESS);
}

static void teardown(void)
{
    cr_assert_eq(loomi_build_done(&B), LOOM_SUCCESS);
    loomi_sched_free(&S);
}

/* Step i depends on exactly the n steps listed (in any order). */
static void deps_are(uint32_t i, int n, const uint32_t *want)
{
    cr_assert_lt(i, S.nsteps);
    cr_assert_eq(S.ndeps[i], n, "step %u has %u dependencies, not %d", i, S.ndeps[i], n);
    for (int k = 0; k < n; k++) {
        int found = 0;
        for (int j = 0; j < S.ndeps[i]; j++) found |= S.deps[i][j] == want[k];
        cr_assert(found, "step %u does not depend on step %u", i, want[k]);
    }
}

TestSuite(build, .init = setup, .fini = teardown);

Test(build, read_after_write)
{
    uint32_t rv = loomi_brecv(&B, 1, 0, LOOMI_BUF_SCRATCH, 0, 16);
    uint32_t sd = loomi_bsend(&B, 2, 0, LOOMI_BUF_SCRATCH, 32, 4); /* inside the received bytes */
    deps_are(rv, 0, NULL);
    deps_are(sd, 1, &rv);
}

Test(build, write_after_read)
{
    uint32_t sd = loomi_bsend(&B, 1, 0, LOOMI_BUF_RECV, 0, 8);
    uint32_t rv = loomi_brecv(&B, 2, 0, LOOMI_BUF_RECV, 28, 8); /* overlaps its last 4 bytes */
    deps_are(sd, 0, NULL);
    deps_are(rv, 1, &sd);
}

Test(build, write_after_write)
{
    uint32_t a = loomi_brecv(&B, 1, 0, LOOMI_BUF_RECV, 0, 8);
    uint32_t b = loomi_bcopy(&B, LOOMI_BUF_RECV, 16, LOOMI_BUF_SEND, 0, 8);
    deps_are(b, 1, &a);
}

Test(build, disjoint_ranges_are_unordered)
{
    loomi_brecv(&B, 1, 0, LOOMI_BUF_RECV, 0, 8);
    uint32_t b = loomi_brecv(&B, 1, 1, LOOMI_BUF_RECV, 32, 8); /* the next bytes */
    uint32_t c = loomi_brecv(&B, 1, 2, LOOMI_BUF_SCRATCH, 0, 8); /* another buffer */
    uint32_t d = loomi_bsend(&B, 1, 3, LOOMI_BUF_SEND, 0, 8);   /* nobody wrote SEND */
    deps_are(b, 0, NULL);
    deps_are(c, 0, NULL);
    deps_are(d, 0, NULL);
    /* Two readers of one range are unordered too. */
    uint32_t e = loomi_bsend(&B, 2, 3, LOOMI_BUF_RECV, 0, 8);
    uint32_t f = loomi_bsend(&B, 3, 3, LOOMI_BUF_RECV, 0, 8);
    deps_are(f, 1, (uint32_t[]){0});
    deps_are(e, 1, (uint32_t[]){0});
}

Test(build, reduce_waits_for_both_inputs_and_the_readers_of_its_output)
{
    uint32_t rv = loomi_brecv(&B, 1, 0, LOOMI_BUF_SCRATCH, 0, 16);
    uint32_t sd = loomi_bsend(&B, 2, 0, LOOMI_BUF_RECV, 0, 16);
    uint32_t red = loomi_breduce(&B, LOOMI_BUF_RECV, 0, LOOMI_BUF_RECV, 0, LOOMI_BUF_SCRATCH, 0, 16);
    deps_are(red, 2, (uint32_t[]){rv, sd});
    /* The next receive into the scratch range waits for the reduce that
     * read it, which already waited for the first receive: one dependency. */
    uint32_t rv2 = loomi_brecv(&B, 1, 1, LOOMI_BUF_SCRATCH, 0, 16);
    deps_are(rv2, 1, &red);
}

Test(build, many_readers_are_joined)
{
    uint32_t w = loomi_brecv(&B, 1, 0, LOOMI_BUF_RECV, 0, 16);
    for (int q = 1; q < 4; q++) loomi_bsend(&B, q, 1, LOOMI_BUF_RECV, 0, 16);
    for (int q = 1; q < 4; q++) loomi_bsend(&B, q, 2, LOOMI_BUF_RECV, 0, 16);
    uint32_t before = S.nsteps;
    uint32_t x = loomi_bcopy(&B, LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, 16);
    cr_assert_gt(x, before, "six readers are joined by extra steps first");
    cr_assert_leq(S.ndeps[x], LOOMI_MAX_DEPS);
    (void)w;
}

Test(build, steps_already_in_the_schedule_count)
{
    /* Take over a schedule with a copy in it. */
    cr_assert_eq(loomi_build_done(&B), LOOM_SUCCESS);
    uint32_t cp = loomi_sched_copy(&S, LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, 8, NULL, 0);
    cr_assert_eq(loomi_build_init(&B, &S, 1024, 64), LOOM_SUCCESS);
    uint32_t sd = loomi_bsend(&B, 1, 0, LOOMI_BUF_RECV, 0, 8);
    deps_are(sd, 1, &cp);
}

Test(build, in_place_reduce_scatter_recv_is_in_send)
{
    cr_assert_eq(loomi_build_done(&B), LOOM_SUCCESS);
    loomi_sched_free(&S);
    loomi_sched_init(&S, 2, 4, LOOM_FLOAT32, LOOM_SUM);
    S.buf_bytes[LOOMI_BUF_SEND] = 4 * 64;
    S.buf_bytes[LOOMI_BUF_RECV] = 64;
    cr_assert_eq(loomi_build_init(&B, &S, 64, 64), LOOM_SUCCESS);
    B.recv_in_send = 1;
    uint32_t sd = loomi_bsend(&B, 1, 0, LOOMI_BUF_SEND, 2 * 64, 16); /* block 2 */
    uint32_t rv = loomi_brecv(&B, 1, 1, LOOMI_BUF_RECV, 0, 16);      /* the same bytes */
    deps_are(rv, 1, &sd);
}

Test(build, chunking)
{
    /* 1024 bytes in chunks of 64: 16 chunks; the cap holds for huge ones. */
    cr_assert_eq(B.C, 16);
    cr_assert_eq(loomi_build_chunks(100, 64), 2);
    cr_assert_eq(loomi_build_chunks(0, 64), 1);
    cr_assert_eq(loomi_build_chunks((size_t)1 << 40, 4096), LOOMI_MAX_CHUNKS);
    /* Chunks of a segment tile it; chunk c of step k+1 waits only for
     * chunk c of step k. */
    struct loomi_seg g = loomi_seg_make(250, 1);
    size_t end = 0;
    uint32_t rv[16];
    for (size_t c = 0; c < B.C; c++) {
        size_t o, n;
        loomi_build_chunk(&B, &g, 0, c, &o, &n);
        cr_assert_eq(o, end);
        end = o + n * 4;
        rv[c] = loomi_brecv(&B, 1, (uint32_t)c, LOOMI_BUF_RECV, o, n);
    }
    cr_assert_eq(end, 1000);
    for (size_t c = 0; c < B.C; c++) {
        size_t o, n;
        loomi_build_chunk(&B, &g, 0, c, &o, &n);
        uint32_t sd = loomi_bsend(&B, 2, (uint32_t)c, LOOMI_BUF_RECV, o, n);
        deps_are(sd, 1, &rv[c]);
    }
}
