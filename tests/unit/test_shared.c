/*
 * test_shared.c - the shared-arena allreduce (src/coll/shared.c) and the
 * steps it relies on: schedules validated for many host layouts, then
 * run through the public API over the sim transport (whose arenas are
 * filled with garbage, so a read of what nobody wrote shows up), every
 * element checked, every rank's result bit-identical.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "coll/validate.h"
#include "comm/local.h"
#include "core/hostmap.h"
#include "topo/select.h"
#include "tests/sim/harness.h"

/* host_of for H hosts of L ranks, blocked (0,0,1,1) or interleaved (0,1,0,1). */
static void layout(int *host_of, int H, int L, int interleave)
{
    for (int r = 0; r < H * L; r++) host_of[r] = interleave ? r % H : r / L;
}

/* Build COLL's shared schedules for every rank of H hosts of L and
 * validate them together; a window (win) only for the allreduce. */
static void validate_coll(int coll, int H, int L, int interleave, size_t count, int inplace,
                          size_t arena, int win)
{
    const int p = H * L;
    int host_of[64];
    layout(host_of, H, L, interleave);
    struct loomi_hostmap *m = loomi_hostmap_build(p, host_of);
    cr_assert_not_null(m);
    struct loomi_sched s[64];
    struct loomi_coll_args a[64];
    for (int r = 0; r < p; r++) {
        memset(&a[r], 0, sizeof a[r]);
        a[r].coll = coll;
        a[r].count = count;
        a[r].inplace = inplace;
        a[r].chunk_bytes = 4096;
        a[r].hosts = m;
        a[r].shared_bytes = arena;
        a[r].root = coll == LOOMI_COLL_BROADCAST ? p - 1 : 0; /* not the first */
        if (win) { /* a loom_mem_alloc window: SEND at 64, RECV after it */
            a[r].win_id = 7;
            a[r].win_send_off = inplace ? count * 4 + 128 : 64;
            a[r].win_recv_off = count * 4 + 128;
            a[r].win_bytes = 2 * count * 4 + 256;
        }
        loom_result_t rc = loomi_coll_build(&s[r], r, p, LOOM_FLOAT32,
                                            coll == LOOMI_COLL_ALLREDUCE ? LOOM_SUM : LOOM_AVG,
                                            &a[r], LOOMI_ALGO_SHARED);
        cr_assert_eq(rc, LOOM_SUCCESS, "build %dx%d n=%zu: %s", H, L, count,
                     loom_get_last_error());
    }
    char msg[512];
    loom_result_t rc = loomi_sched_validate_coll(s, p, a, 1, NULL, msg, sizeof msg);
    cr_assert_eq(rc, LOOM_SUCCESS, "%s %dx%d%s n=%zu inplace=%d: %s", loomi_coll_name(coll), H,
                 L, interleave ? " interleaved" : "", count, inplace, msg);
    for (int r = 0; r < p; r++) {
        if (count && coll == LOOMI_COLL_ALLREDUCE) cr_assert_eq(s[r].win_id, win ? 7u : 0u);
        /* The reduce-scatter, allgather and broadcast: through the
         * arenas on one host, the hierarchical form across hosts. */
        if (count && coll != LOOMI_COLL_ALLREDUCE)
            cr_assert_eq(s[r].nshared, H == 1 ? L : 0, "%dx%d", H, L);
        loomi_sched_free(&s[r]);
    }
    free(m);
}

static void validate(int H, int L, int interleave, size_t count, int inplace, size_t arena)
{
    validate_coll(LOOMI_COLL_ALLREDUCE, H, L, interleave, count, inplace, arena, 0);
    validate_coll(LOOMI_COLL_ALLREDUCE, H, L, interleave, count, inplace, arena, 1);
}

Test(shared, schedules_validate)
{
    const int lay[][2] = {{1, 2}, {1, 3}, {1, 4}, {1, 7}, {2, 2}, {2, 3}, {3, 2}, {4, 4}, {2, 8}};
    const size_t counts[] = {0, 1, 3, 7, 1001, 9000};
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++)
        for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++)
            for (int ip = 0; ip < 2; ip++)
                for (int il = 0; il < 2; il++)
                    validate(lay[i][0], lay[i][1], il, counts[j], ip, 8192);
}

/* In-place saves past LOOM_SHM_STREAM: -1 as the communicator measures
 * (non-blocking calls, as here, take the first trial's: cached), else
 * decided streamed (1) or cached (0). */
static int saves_mode = -1;
/* The copy-in into the arenas (LOOM_SHM_STREAM_COPYIN): -1 as measured
 * (non-blocking calls: cached), else streamed (1) or cached (0). */
static int copyin_mode = -1;

/* A sim world of H hosts of L ranks with LOOM_SHM_SIZE arenas. */
static struct loomi_sim_world *open_world(int H, int L, int interleave, size_t arena,
                                          uint64_t seed, loom_comm_t *comms)
{
    char env[32];
    snprintf(env, sizeof env, "%zu", arena);
    setenv("LOOM_SHM_SIZE", env, 1);
    struct loomi_sim_world *w;
    cr_assert_eq(loomi_sim_world_create(H * L, seed, NULL, &w, comms), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    int host_of[64];
    layout(host_of, H, L, interleave);
    for (int r = 0; r < H * L; r++)
        cr_assert_eq(loomi_comm_set_hosts(comms[r], host_of), LOOM_SUCCESS);
    return w;
}

/* Rank r's input element i: small integers, so that every order of
 * summation gives the same value. */
static void put_input(void *b, size_t i, int r, loom_datatype_t dt)
{
    int v = (int)((r + 1) * (i % 7 + 1));
    if (dt == LOOM_FLOAT32) ((float *)b)[i] = (float)v;
    else ((int32_t *)b)[i] = v;
}

static double get_elem(const void *b, size_t i, loom_datatype_t dt)
{
    return dt == LOOM_FLOAT32 ? ((const float *)b)[i] : ((const int32_t *)b)[i];
}

/* The reduction over p ranks of input element i. */
static double want_at(size_t i, int p, loom_op_t op, loom_datatype_t dt)
{
    long long e = 0;
    for (int q = 0; q < p; q++) {
        long long v = (long long)(q + 1) * (long long)(i % 7 + 1);
        e = op == LOOM_MAX ? (v > e ? v : e) : e + v;
    }
    double want = op == LOOM_AVG ? (double)e / p : (double)e;
    return op == LOOM_AVG && dt == LOOM_FLOAT32 ? (float)want : want;
}

/* Every rank's operation to completion, which must succeed. */
static void run_world(struct loomi_sim_world *w, loom_comm_t *comms, loom_request_t *req, int H,
                      int L, size_t n)
{
    loom_result_t res[64];
    char msg[256];
    cr_assert_eq(loomi_sim_run(w, comms, req, H * L, 100000000, res, msg, sizeof msg),
                 LOOM_SUCCESS, "%dx%d n=%zu: %s", H, L, n, msg);
}

static void close_world(struct loomi_sim_world *w, loom_comm_t *comms, int p,
                        unsigned char **sb, unsigned char **rb)
{
    loomi_sim_world_destroy(w, comms);
    for (int r = 0; r < p; r++) {
        free(sb[r]);
        free(rb[r]);
    }
}

/* Run through the public API; returns the number of wrong elements. */
static int run(int H, int L, int interleave, size_t n, int inplace, loom_op_t op,
               loom_datatype_t dt, size_t arena, uint64_t seed)
{
    const int p = H * L;
    loom_comm_t comms[64];
    struct loomi_sim_world *w = open_world(H, L, interleave, arena, seed, comms);
    size_t es = loom_datatype_size(dt);
    unsigned char *sb[64], *rb[64];
    loom_request_t req[64];
    for (int r = 0; r < p; r++) {
        loomi_comm_force_algo(comms[r], LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_SHARED);
        if (saves_mode >= 0) loomi_comm_get(comms[r])->saves = (struct loomi_mode_tuner){1, 1, saves_mode, {0}};
        loomi_comm_get(comms[r])->set.shm_stream_copyin = copyin_mode;
        sb[r] = malloc(n * es + 1);
        rb[r] = malloc(n * es + 1);
        for (size_t i = 0; i < n; i++) put_input(sb[r], i, r, dt);
        if (inplace) memcpy(rb[r], sb[r], n * es);
        cr_assert_eq(loom_iallreduce(inplace ? rb[r] : sb[r], rb[r], n, dt, op, comms[r],
                                     &req[r]),
                     LOOM_SUCCESS, "%s", loom_get_last_error());
    }
    run_world(w, comms, req, H, L, n);
    int bad = 0;
    for (int r = 0; r < p; r++) {
        for (size_t i = 0; i < n && !bad; i++) {
            double want = want_at(i, p, op, dt), got = get_elem(rb[r], i, dt);
            if (got != want) {
                cr_log_error("%dx%d%s n=%zu inplace=%d op=%d rank %d [%zu] = %g, want %g", H, L,
                             interleave ? " interleaved" : "", n, inplace, (int)op, r, i, got,
                             want);
                bad++;
            }
        }
        if (r) cr_expect_eq(memcmp(rb[r], rb[0], n * es), 0, "rank %d differs from rank 0", r);
    }
    close_world(w, comms, p, sb, rb);
    return bad;
}

typedef int (*runner)(int H, int L, int interleave, size_t n, int inplace, loom_op_t op,
                      loom_datatype_t dt, size_t arena, uint64_t seed);

/* One host of 2-8 ranks, every op, in and out of place, up to `big`
 * elements, through 64 KiB arenas; returns the wrong elements. */
static int one_host_sweep(runner f, size_t big, uint64_t seed)
{
    const int Ls[] = {2, 3, 4, 5, 8};
    const size_t ns[] = {1, 3, 100, 1001, big};
    const loom_op_t ops[] = {LOOM_SUM, LOOM_AVG, LOOM_MAX};
    int bad = 0;
    for (size_t i = 0; i < sizeof Ls / sizeof Ls[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (int ip = 0; ip < 2; ip++)
                for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
                    bad += f(1, Ls[i], 0, ns[j], ip, ops[o], LOOM_FLOAT32, 65536, seed + j);
    return bad;
}

Test(shared, one_host_every_op_in_and_out_of_place)
{
    /* 40000 floats take 5 rounds over both halves. */
    cr_assert_eq(one_host_sweep(run, 40000, 11), 0);
}

Test(shared, several_hosts_with_rails)
{
    const int lay[][2] = {{2, 2}, {2, 3}, {3, 2}, {4, 2}, {2, 4}};
    const size_t ns[] = {1, 5, 1001, 20000};
    int bad = 0;
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (int ip = 0; ip < 2; ip++)
                for (int il = 0; il < 2; il++) {
                    bad += run(lay[i][0], lay[i][1], il, ns[j], ip, LOOM_SUM, LOOM_INT32, 65536,
                               3 + j);
                    bad += run(lay[i][0], lay[i][1], il, ns[j], ip, LOOM_AVG, LOOM_FLOAT32,
                               65536, 5 + j);
                }
    cr_assert_eq(bad, 0);
}

Test(shared, falls_back_without_a_layout)
{
    /* No hostmap (every rank its own host) and uneven hosts: a flat ring. */
    cr_assert_eq(run(4, 1, 0, 1001, 0, LOOM_SUM, LOOM_INT32, 65536, 1), 0);
    int host_of[5] = {0, 0, 0, 1, 1};
    struct loomi_hostmap *m = loomi_hostmap_build(5, host_of);
    struct loomi_coll_args a = {.coll = LOOMI_COLL_ALLREDUCE, .count = 100, .chunk_bytes = 4096,
                                .hosts = m, .shared_bytes = 16384};
    struct loomi_sched s;
    cr_assert_eq(loomi_coll_build(&s, 0, 5, LOOM_INT32, LOOM_SUM, &a, LOOMI_ALGO_SHARED),
                 LOOM_SUCCESS);
    cr_assert_eq(s.nshared, 0, "uneven hosts must not use the arenas");
    loomi_sched_free(&s);
    free(m);
}

Test(shared, arena_out_of_range_is_refused)
{
    /* A step naming an arena past the host's ranks never reaches the engine. */
    int host_of[2] = {0, 0};
    struct loomi_hostmap *m = loomi_hostmap_build(2, host_of);
    struct loomi_sched s;
    loomi_sched_init(&s, 0, 2, LOOM_INT32, LOOM_SUM);
    s.nshared = 2;
    s.shared_bytes = 64;
    loomi_sched_copy(&s, LOOMI_BUF_SHARED + 2, 0, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    s.buf_bytes[LOOMI_BUF_RECV] = 16;
    cr_assert_neq(loomi_sched_finish(&s), LOOM_SUCCESS, "arena 2 of 2 accepted");
    loomi_sched_free(&s);
    free(m);
}

/* Rank 0's schedule of the shared allreduce of `count` floats, L ranks
 * on one host with 64K arenas, LOOM_SHM_STREAM `stream`, the saves and
 * the copy-in streamed or not; returns the host map, for free(). */
static struct loomi_hostmap *build_one_host(struct loomi_sched *s, int L, size_t count,
                                            int inplace, size_t stream, int ssave, int copyin)
{
    int host_of[8] = {0};
    struct loomi_hostmap *m = loomi_hostmap_build(L, host_of);
    cr_assert_not_null(m);
    struct loomi_coll_args a = {.coll = LOOMI_COLL_ALLREDUCE, .count = count,
                                .inplace = inplace, .chunk_bytes = 4096, .hosts = m,
                                .shared_bytes = 65536, .stream_bytes = stream,
                                .stream_saves = ssave, .stream_copyin = copyin};
    cr_assert_eq(loomi_coll_build(s, 0, L, LOOM_FLOAT32, LOOM_SUM, &a, LOOMI_ALGO_SHARED),
                 LOOM_SUCCESS, "%s", loom_get_last_error());
    return m;
}

/* How many of rank 0's copies into RECV stream (and how many do not),
 * for L ranks on one host; in place, any streamed save counts in yes
 * too (stream_saves: ssave). */
static void count_streamed(int L, size_t count, int inplace, size_t stream, int ssave, int *yes,
                           int *no)
{
    struct loomi_sched s;
    struct loomi_hostmap *m = build_one_host(&s, L, count, inplace, stream, ssave, 0);
    *yes = *no = 0;
    for (uint32_t i = 0; i < s.nsteps; i++) {
        const struct loomi_step *st = &s.steps[i];
        if (st->kind != LOOMI_STEP_COPY || st->dst != LOOMI_BUF_RECV || !st->count) continue;
        if (st->flags & LOOMI_COPY_STREAM) ++*yes;
        else ++*no;
    }
    if (inplace) {
        /* The saves: streamed only where stream_saves says so. */
        for (uint32_t i = 0; i < s.nsteps; i++) {
            const struct loomi_step *st = &s.steps[i];
            if ((st->kind == LOOMI_STEP_COPY && (st->flags & LOOMI_COPY_STREAM)) ||
                (st->kind == LOOMI_STEP_REDUCE_SHARED && (st->flags & LOOMI_RS_STREAM)))
                ++*yes;
        }
    }
    loomi_sched_free(&s);
    free(m);
}

/* Out of place, from LOOM_SHM_STREAM bytes of vectors on the host, the
 * copy-out into RECV uses streaming stores; in place (RECV was just read)
 * and below the threshold it does not, and in place the saves stream
 * only where stream_saves asks it; the results are the same. */
Test(shared, streams_results_past_the_threshold)
{
    int yes, no;
    const size_t n = 40000; /* floats: 160000 bytes, 3 ranks 480000 */
    count_streamed(3, n, 0, 480000, 1, &yes, &no);
    cr_assert(yes > 0 && no == 0, "3 x %zu B from 480000: %d streamed, %d not", n * 4, yes, no);
    count_streamed(3, n, 0, 480004, 1, &yes, &no);
    cr_assert(yes == 0 && no > 0, "below the threshold: %d streamed", yes);
    count_streamed(3, n, 1, 1024, 0, &yes, &no);
    cr_assert(yes == 0 && no > 0, "in place, cached saves: %d streamed", yes);
    count_streamed(3, n, 1, 1024, 1, &yes, &no);
    cr_assert(yes > 0 && no > 0, "in place, streamed saves: %d streamed, %d not", yes, no);
    count_streamed(3, n, 1, 480004, 1, &yes, &no);
    cr_assert(yes == 0 && no > 0, "in place below the threshold: %d streamed", yes);
    count_streamed(3, n, 0, 0, 1, &yes, &no);
    cr_assert(yes == 0 && no > 0, "LOOM_SHM_STREAM=0: %d streamed", yes);
    /* The results through the engine, with every mix of streamed and
     * cached stores: copyin_streams_where_asked. */
}

/* The tuner alternates cached and streamed stores over its trials, then
 * keeps streamed only where its best time per byte beat cached's by 5%. */
Test(shared, tuner_keeps_the_faster)
{
    struct loomi_mode_tuner t = {0};
    for (int i = 0; i < LOOMI_TUNER_TRIALS; i++) {
        int m = loomi_tuner_mode(&t);
        cr_assert_eq(m, i % 2, "trial %d ran mode %d", i, m);
        loomi_tuner_record(&t, m, 1000, m ? 900.0 + i : 1000.0 + i); /* streamed 10% faster */
    }
    cr_assert(t.decided);
    cr_assert_eq(loomi_tuner_mode(&t), 1);
    loomi_tuner_record(&t, 0, 1000, 1.0); /* decided: later calls change nothing */
    cr_assert_eq(loomi_tuner_mode(&t), 1);

    struct loomi_mode_tuner u = {0};
    for (int i = 0; i < LOOMI_TUNER_TRIALS; i++) {
        int m = loomi_tuner_mode(&u);
        loomi_tuner_record(&u, m, 1000, m ? 980.0 : 1000.0); /* within 5%: cached */
    }
    cr_assert(u.decided);
    cr_assert_eq(loomi_tuner_mode(&u), 0);

    struct loomi_mode_tuner v = {0};
    for (int i = 0; i < LOOMI_TUNER_TRIALS; i++) {
        int m = loomi_tuner_mode(&v);
        loomi_tuner_record(&v, m, 1000, m ? 2000.0 : 1000.0);
    }
    cr_assert_eq(loomi_tuner_mode(&v), 0);
}

/* The copy-in's tuners: one per power of two of bytes from
 * LOOMI_COPYIN_MIN, in place and out of place apart; none below. */
Test(shared, copyin_tuners_go_by_size)
{
    struct loomi_copyin_tuner c;
    memset(&c, 0, sizeof c);
    const size_t K = LOOMI_COPYIN_MIN;
    cr_assert_null(loomi_copyin_tuner_for(&c, 0, K - 1));
    cr_assert_null(loomi_copyin_tuner_for(&c, 1, 0));
    cr_assert_eq(loomi_copyin_tuner_for(&c, 0, K), &c.t[0][0]);
    cr_assert_eq(loomi_copyin_tuner_for(&c, 0, 2 * K - 1), &c.t[0][0]);
    cr_assert_eq(loomi_copyin_tuner_for(&c, 0, 2 * K), &c.t[0][1]);
    cr_assert_eq(loomi_copyin_tuner_for(&c, 1, 2 * K), &c.t[1][1]);
    cr_assert_eq(loomi_copyin_tuner_for(&c, 0, (size_t)64 << 20), &c.t[0][10]);
    cr_assert_eq(loomi_copyin_tuner_for(&c, 1, SIZE_MAX), &c.t[1][LOOMI_COPYIN_SIZES - 1]);
    /* A size decided streamed leaves its neighbours on trial. */
    struct loomi_mode_tuner *t = loomi_copyin_tuner_for(&c, 0, 3 * K);
    for (int i = 0; i < LOOMI_TUNER_TRIALS; i++) {
        int m = loomi_tuner_mode(t);
        loomi_tuner_record(t, m, 3 * K, m ? 500.0 : 1000.0);
    }
    cr_assert(t->decided && t->mode == 1);
    cr_assert(!c.t[0][0].decided && !c.t[0][2].decided && !c.t[1][1].decided);
}

/* Rank 0's copies into its own arena (the staged copy-in): how many
 * stream the arena's stores, and how many stream a save, in and out of
 * place, with stream_copyin and stream_saves as given. */
static void count_copyin(int L, size_t count, int inplace, int ssave, int copyin, int *arena,
                         int *saves, int *all)
{
    struct loomi_sched s;
    struct loomi_hostmap *m = build_one_host(&s, L, count, inplace, 1024, ssave, copyin);
    *arena = *saves = *all = 0;
    for (uint32_t i = 0; i < s.nsteps; i++) {
        const struct loomi_step *st = &s.steps[i];
        if (st->kind != LOOMI_STEP_COPY || st->dst != LOOMI_BUF_SHARED || !st->count) continue;
        ++*all;
        const int also = (st->flags & LOOMI_COPY_ALSO) != 0;
        cr_assert_eq(also, inplace, "the copy-in saves (in place) or not");
        if (also ? (st->flags & LOOMI_COPY_STREAM_DST) : (st->flags & LOOMI_COPY_STREAM))
            ++*arena;
        if (also && (st->flags & LOOMI_COPY_STREAM)) ++*saves;
    }
    loomi_sched_free(&s);
    free(m);
}

/* The copy-in streams the arena's stores exactly when stream_copyin asks
 * it, in place (beside streamed saves or cached ones) and out of place;
 * the results are the same with the saves and the copy-in streamed or
 * cached, through the engine (the sim's arenas hold garbage until
 * written). */
Test(shared, copyin_streams_where_asked)
{
    const size_t n = 40000;
    for (int ip = 0; ip < 2; ip++)
        for (int ss = 0; ss < 2; ss++)
            for (int ci = 0; ci < 2; ci++) {
                int arena, saves, all;
                count_copyin(3, n, ip, ss, ci, &arena, &saves, &all);
                cr_assert(all > 0, "no copy-in");
                cr_assert_eq(arena, ci ? all : 0, "in place %d, saves %d, copy-in %d: %d of %d",
                             ip, ss, ci, arena, all);
                cr_assert_eq(saves, ip && ss ? all : 0, "in place %d, saves %d: %d of %d saves",
                             ip, ss, saves, all);
            }
    setenv("LOOM_SHM_STREAM", "1K", 1);
    int bad = 0;
    /* 40013: slices off 64-byte lines, so the streamed copies have heads
     * and tails, and a save that lies unlike its arena goes cached. */
    const size_t ns[] = {1001, 40000, 40013};
    for (copyin_mode = 0; copyin_mode < 2; copyin_mode++)
        for (saves_mode = 0; saves_mode < 2; saves_mode++)
            for (int L = 2; L <= 4; L++)
                for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
                    for (int ip = 0; ip < 2; ip++) {
                        bad += run(1, L, 0, ns[j], ip, LOOM_SUM, LOOM_FLOAT32, 65536, 23 + j);
                        bad += run(1, L, 0, ns[j], ip, LOOM_AVG, LOOM_FLOAT32, 65536, 29 + j);
                    }
    copyin_mode = saves_mode = -1;
    unsetenv("LOOM_SHM_STREAM");
    cr_assert_eq(bad, 0);
}

/* The window form in place: every step that writes RECV saves what it
 * overwrites (to SCRATCH at the same offset) or writes only what such a
 * step already saved (the rails, AVG); the staged steps (copy-in, the
 * arena) are gone; every peer's descriptor is checked before anything
 * reads a window.  The saves are cached stores below LOOM_SHM_STREAM,
 * and past it too unless stream_saves asks them to stream. */
Test(shared, window_in_place_saves_what_it_overwrites)
{
    for (int k = 0; k < 12; k++) {
        const int L = 2 + k % 3, ssave = k >= 6, past = k % 6 < 3;
        int host_of[8] = {0};
        struct loomi_hostmap *m = loomi_hostmap_build(L, host_of);
        const size_t n = 40013;
        /* Past the threshold (ranks x bytes), or not. */
        const size_t stream = past ? (size_t)L * n * 4 : (size_t)L * n * 4 + 1;
        struct loomi_coll_args a = {.coll = LOOMI_COLL_ALLREDUCE, .count = n, .inplace = 1,
                                    .chunk_bytes = 4096, .hosts = m, .shared_bytes = 65536,
                                    .stream_bytes = stream, .stream_saves = ssave,
                                    .win_id = 3, .win_send_off = 4096, .win_recv_off = 4096,
                                    .win_bytes = 4096 + n * 4};
        struct loomi_sched s;
        cr_assert_eq(loomi_coll_build(&s, 1, L, LOOM_FLOAT32, LOOM_AVG, &a, LOOMI_ALGO_SHARED),
                     LOOM_SUCCESS, "%s", loom_get_last_error());
        cr_assert(s.saves_input && s.win_id == 3 && s.nshared == L);
        cr_assert_eq(s.desc_len, 32u);
        cr_assert_eq(s.desc[1], 3u);
        cr_assert_eq(s.desc[2], 4096u);
        unsigned char *saved = calloc(n, 1); /* per element: saved before written */
        int expects = 0, reduces = 0, copies = 0;
        for (uint32_t i = 0; i < s.nsteps; i++) {
            const struct loomi_step *st = &s.steps[i];
            if (st->kind == LOOMI_STEP_EXPECT) expects++;
            if (st->kind == LOOMI_STEP_SEND || st->kind == LOOMI_STEP_RECV) continue;
            if (st->kind == LOOMI_STEP_EXPECT || !st->count) continue;
            cr_assert(st->dst < LOOMI_BUF_SHARED, "step %u writes a window or an arena", i);
            if (st->dst != LOOMI_BUF_RECV) continue;
            size_t e0 = st->dst_off / 4;
            int saves = (st->kind == LOOMI_STEP_REDUCE_SHARED && (st->flags & LOOMI_RS_SAVE)) ||
                        (st->kind == LOOMI_STEP_COPY && (st->flags & LOOMI_COPY_SAVE) &&
                         st->src2 == LOOMI_BUF_SCRATCH && st->src2_off == st->dst_off);
            reduces += st->kind == LOOMI_STEP_REDUCE_SHARED;
            copies += st->kind == LOOMI_STEP_COPY;
            if (saves) {
                int nt = st->kind == LOOMI_STEP_COPY ? (st->flags & LOOMI_COPY_STREAM) != 0
                                                     : (st->flags & LOOMI_RS_STREAM) != 0;
                cr_assert_eq(nt, ssave && past, "L %d, threshold %zu, stream_saves %d: step %u's "
                             "save streams: %d", L, stream, ssave, i, nt);
            }
            for (size_t e = e0; e < e0 + st->count; e++) {
                if (saves) saved[e] = 1;
                cr_assert(saved[e], "step %u (kind %d) overwrites element %zu unsaved", i,
                          st->kind, e);
            }
        }
        for (size_t e = 0; e < n; e++) cr_assert(saved[e], "element %zu never written", e);
        cr_assert_eq(expects, L - 1, "%d descriptor checks for %d peers", expects, L - 1);
        cr_assert(reduces > 0 && copies > 0);
        free(saved);
        loomi_sched_free(&s);
        free(m);
    }
}

/* A descriptor check out of range, or naming a bad peer, is refused. */
Test(shared, expect_steps_are_range_checked)
{
    struct loomi_sched s;
    loomi_sched_init(&s, 0, 2, LOOM_INT32, LOOM_SUM);
    s.buf_bytes[LOOMI_BUF_SCRATCH] = 64;
    loomi_sched_expect(&s, LOOMI_BUF_SCRATCH, 0, LOOMI_BUF_SCRATCH, 40, 8, 1, NULL, 0);
    cr_assert_neq(loomi_sched_finish(&s), LOOM_SUCCESS, "a check past SCRATCH accepted");
    loomi_sched_free(&s);
    loomi_sched_init(&s, 0, 2, LOOM_INT32, LOOM_SUM);
    s.buf_bytes[LOOMI_BUF_SCRATCH] = 64;
    loomi_sched_expect(&s, LOOMI_BUF_SCRATCH, 0, LOOMI_BUF_SCRATCH, 32, 8, 2, NULL, 0);
    cr_assert_neq(loomi_sched_finish(&s), LOOM_SUCCESS, "a check from rank 2 of 2 accepted");
    loomi_sched_free(&s);
    loomi_sched_init(&s, 0, 2, LOOM_INT32, LOOM_SUM);
    s.buf_bytes[LOOMI_BUF_SCRATCH] = 64;
    s.desc_len = 32;
    s.desc_off = 40;
    cr_assert_neq(loomi_sched_finish(&s), LOOM_SUCCESS, "a descriptor past SCRATCH accepted");
    loomi_sched_free(&s);
}

/* Out of place on one host, the window form pushes each reduced slice
 * into every RECV and copies nothing out (streamed past LOOM_SHM_STREAM);
 * across hosts the slices are final only after the rails, so each rank
 * copies them out of their owners' RECV. */
Test(shared, window_out_of_place_pushes_on_one_host)
{
    for (int H = 1; H <= 2; H++) {
        const int L = 3, p = H * L;
        int host_of[6];
        layout(host_of, H, L, 0);
        struct loomi_hostmap *m = loomi_hostmap_build(p, host_of);
        const size_t n = 40013;
        struct loomi_coll_args a = {.coll = LOOMI_COLL_ALLREDUCE, .count = n,
                                    .chunk_bytes = 4096, .hosts = m, .shared_bytes = 65536,
                                    .stream_bytes = 1024, .win_id = 2, .win_send_off = 0,
                                    .win_recv_off = n * 4, .win_bytes = 2 * n * 4};
        struct loomi_sched s;
        cr_assert_eq(loomi_coll_build(&s, 1, p, LOOM_FLOAT32, LOOM_AVG, &a, LOOMI_ALGO_SHARED),
                     LOOM_SUCCESS, "%s", loom_get_last_error());
        int pushes = 0, plain = 0, copies = 0, avgs = 0;
        for (uint32_t i = 0; i < s.nsteps; i++) {
            const struct loomi_step *st = &s.steps[i];
            if (st->kind == LOOMI_STEP_REDUCE_SHARED) {
                if ((st->flags & (LOOMI_RS_PUSH | LOOMI_RS_STREAM)) ==
                    (LOOMI_RS_PUSH | LOOMI_RS_STREAM))
                    pushes++;
                else plain++;
            }
            copies += st->kind == LOOMI_STEP_COPY && st->count && st->dst == LOOMI_BUF_RECV;
            avgs += st->kind == LOOMI_STEP_AVG;
        }
        if (H == 1) {
            cr_assert(pushes > 0 && plain == 0 && copies == 0 && avgs == 0,
                      "one host: %d pushes, %d plain reductions, %d copies, %d avg", pushes,
                      plain, copies, avgs);
            cr_assert_eq(s.win_push_off, n * 4);
        } else {
            cr_assert(pushes == 0 && plain > 0 && copies > 0,
                      "two hosts: %d pushes, %d plain reductions, %d copies", pushes, plain,
                      copies);
        }
        loomi_sched_free(&s);
        free(m);
    }
}

/* The staged form on one host: the reducer of a slice writes it into its
 * RECV and its arena in one pass (LOOMI_RS_KEEP) and copies out only the
 * others' slices, so RECV is written once per element; in place every
 * element is saved before it is overwritten.  With rails (two hosts) the
 * slice is final only after them: no KEEP, every slice copied out. */
Test(shared, staged_reducer_keeps_its_slice_on_one_host)
{
    for (int H = 1; H <= 2; H++)
        for (int ip = 0; ip < 2; ip++) {
            const int L = 3, p = H * L;
            int host_of[6];
            layout(host_of, H, L, 0);
            struct loomi_hostmap *m = loomi_hostmap_build(p, host_of);
            const size_t n = 40013;
            struct loomi_coll_args a = {.coll = LOOMI_COLL_ALLREDUCE, .count = n,
                                        .inplace = ip, .chunk_bytes = 4096, .hosts = m,
                                        .shared_bytes = 65536, .stream_bytes = 1024};
            struct loomi_sched s;
            cr_assert_eq(loomi_coll_build(&s, 1, p, LOOM_FLOAT32, LOOM_AVG, &a,
                                          LOOMI_ALGO_SHARED),
                         LOOM_SUCCESS, "%s", loom_get_last_error());
            unsigned char *written = calloc(n, 1), *saved = calloc(n, 1);
            int keeps = 0, avgs = 0;
            for (uint32_t i = 0; i < s.nsteps; i++) {
                const struct loomi_step *st = &s.steps[i];
                if (st->kind == LOOMI_STEP_SEND || st->kind == LOOMI_STEP_RECV || !st->count)
                    continue;
                size_t e0;
                /* The copy-in's second destination, or a plain copy, into SCRATCH: a save. */
                if (st->kind == LOOMI_STEP_COPY && (st->flags & LOOMI_COPY_ALSO) &&
                    st->src2 == LOOMI_BUF_SCRATCH)
                    for (e0 = st->src2_off / 4; e0 < st->src2_off / 4 + st->count; e0++)
                        saved[e0] = 1;
                if (st->kind == LOOMI_STEP_COPY && st->dst == LOOMI_BUF_SCRATCH &&
                    st->src == LOOMI_BUF_RECV && st->dst_off < n * 4)
                    for (e0 = st->dst_off / 4; e0 < st->dst_off / 4 + st->count; e0++)
                        saved[e0] = 1;
                avgs += st->kind == LOOMI_STEP_AVG;
                if (st->kind == LOOMI_STEP_REDUCE_SHARED && (st->flags & LOOMI_RS_KEEP)) {
                    keeps++;
                    cr_assert_eq(st->dst, LOOMI_BUF_RECV);
                    cr_assert_eq(!!(st->flags & LOOMI_RS_SAVE), ip);
                }
                if (st->dst != LOOMI_BUF_RECV) continue;
                int saves = st->kind == LOOMI_STEP_REDUCE_SHARED && (st->flags & LOOMI_RS_SAVE);
                for (size_t e = st->dst_off / 4; e < st->dst_off / 4 + st->count; e++) {
                    if (saves) saved[e] = 1;
                    if (ip) cr_assert(saved[e], "step %u overwrites element %zu unsaved", i, e);
                    if (H == 1)
                        cr_assert(!written[e], "H 1 ip %d: element %zu written twice", ip, e);
                    written[e]++;
                }
            }
            for (size_t e = 0; e < n; e++) cr_assert(written[e], "element %zu never written", e);
            if (H == 1)
                cr_assert(keeps > 0 && avgs == 0, "one host: %d keeps, %d avg", keeps, avgs);
            else
                cr_assert(keeps == 0, "two hosts: %d keeps", keeps);
            free(written);
            free(saved);
            loomi_sched_free(&s);
            free(m);
        }
}

/* ------------------------------------------------------ reduce-scatter */

Test(shared, reduce_scatter_allgather_broadcast_schedules_validate)
{
    const int colls[] = {LOOMI_COLL_REDUCE_SCATTER, LOOMI_COLL_ALLGATHER, LOOMI_COLL_BROADCAST};
    const int lay[][2] = {{1, 2}, {1, 3}, {1, 4}, {1, 7}, {2, 2}, {2, 3}, {3, 2}};
    const size_t counts[] = {0, 1, 3, 17, 1001, 9000};
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++)
        for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++)
            for (int ip = 0; ip < 2; ip++)
                for (int il = 0; il < 2; il++)
                    for (int c = 0; c < 3; c++)
                        validate_coll(colls[c], lay[i][0], lay[i][1], il, counts[j], ip, 8192,
                                      0);
}

/* A reduce-scatter of n elements a rank through the public API over the
 * sim transport (garbage-filled arenas); returns the wrong elements. */
static int run_rs(int H, int L, int interleave, size_t n, int inplace, loom_op_t op,
                  loom_datatype_t dt, size_t arena, uint64_t seed)
{
    const int p = H * L;
    loom_comm_t comms[64];
    struct loomi_sim_world *w = open_world(H, L, interleave, arena, seed, comms);
    const size_t es = loom_datatype_size(dt);
    unsigned char *sb[64], *rb[64];
    loom_request_t req[64];
    for (int r = 0; r < p; r++) {
        loomi_comm_force_algo(comms[r], LOOMI_COLL_REDUCE_SCATTER, LOOMI_ALGO_SHARED);
        sb[r] = malloc((size_t)p * n * es + 1);
        rb[r] = malloc(n * es + 1);
        for (size_t i = 0; i < (size_t)p * n; i++) put_input(sb[r], i, r, dt);
        void *out = inplace ? sb[r] + (size_t)r * n * es : rb[r];
        cr_assert_eq(loom_ireduce_scatter(sb[r], out, n, dt, op, comms[r], &req[r]),
                     LOOM_SUCCESS, "%s", loom_get_last_error());
    }
    run_world(w, comms, req, H, L, n);
    int bad = 0;
    for (int r = 0; r < p; r++) {
        const unsigned char *out = inplace ? sb[r] + (size_t)r * n * es : rb[r];
        for (size_t i = 0; i < n && !bad; i++) {
            double want = want_at((size_t)r * n + i, p, op, dt), got = get_elem(out, i, dt);
            if (got != want) {
                cr_log_error("rs %dx%d n=%zu inplace=%d op=%d rank %d [%zu] = %g, want %g", H,
                             L, n, inplace, (int)op, r, i, got, want);
                bad++;
            }
        }
        /* In place, the other blocks of the input are never written. */
        for (size_t i = 0; inplace && i < (size_t)p * n && !bad; i++) {
            if (i / n == (size_t)r) continue;
            if (get_elem(sb[r], i, dt) != (double)((r + 1) * (int)(i % 7 + 1))) {
                cr_log_error("rs %dx%d n=%zu rank %d: input [%zu] changed", H, L, n, r, i);
                bad++;
            }
        }
    }
    close_world(w, comms, p, sb, rb);
    return bad;
}

/* one_host_sweep with blocks of 20000 floats (3 to 20 rounds over both
 * halves), then several hosts, which take the hierarchical form. */
static int blocks_sweep(runner f, uint64_t seed)
{
    int bad = one_host_sweep(f, 20000, seed);
    bad += f(2, 2, 0, 1001, 0, LOOM_SUM, LOOM_INT32, 65536, seed + 10);
    bad += f(2, 3, 1, 5000, 1, LOOM_AVG, LOOM_FLOAT32, 65536, seed + 11);
    return bad;
}

Test(shared, reduce_scatter_every_op_in_and_out_of_place)
{
    cr_assert_eq(blocks_sweep(run_rs, 17), 0);
}

/* An allgather of n elements a rank, as run_rs; op unused. */
static int run_ag(int H, int L, int interleave, size_t n, int inplace, loom_op_t op,
                  loom_datatype_t dt, size_t arena, uint64_t seed)
{
    (void)op;
    const int p = H * L;
    loom_comm_t comms[64];
    struct loomi_sim_world *w = open_world(H, L, interleave, arena, seed, comms);
    const size_t es = loom_datatype_size(dt);
    unsigned char *sb[64], *rb[64];
    loom_request_t req[64];
    for (int r = 0; r < p; r++) {
        loomi_comm_force_algo(comms[r], LOOMI_COLL_ALLGATHER, LOOMI_ALGO_SHARED);
        sb[r] = malloc(n * es + 1);
        rb[r] = malloc((size_t)p * n * es + 1);
        memset(rb[r], 0xee, (size_t)p * n * es);
        unsigned char *in = inplace ? rb[r] + (size_t)r * n * es : sb[r];
        for (size_t i = 0; i < n; i++) put_input(in, i, r, dt);
        cr_assert_eq(loom_iallgather(in, rb[r], n, dt, comms[r], &req[r]), LOOM_SUCCESS, "%s",
                     loom_get_last_error());
    }
    run_world(w, comms, req, H, L, n);
    int bad = 0;
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < (size_t)p * n && !bad; i++) {
            const int q = (int)(i / n);
            const double want = (double)((q + 1) * (int)(i % n % 7 + 1));
            if (get_elem(rb[r], i, dt) != want) {
                cr_log_error("ag %dx%d n=%zu inplace=%d rank %d [%zu] = %g, want %g", H, L, n,
                             inplace, r, i, get_elem(rb[r], i, dt), want);
                bad++;
            }
        }
    close_world(w, comms, p, sb, rb);
    return bad;
}

Test(shared, allgather_in_and_out_of_place)
{
    cr_assert_eq(blocks_sweep(run_ag, 29), 0);
}

/* A broadcast of n elements from root (seed % p), as run_ag; op unused. */
static int run_bc(int H, int L, int interleave, size_t n, int inplace, loom_op_t op,
                  loom_datatype_t dt, size_t arena, uint64_t seed)
{
    (void)op;
    const int p = H * L, root = (int)(seed % (uint64_t)p);
    loom_comm_t comms[64];
    struct loomi_sim_world *w = open_world(H, L, interleave, arena, seed, comms);
    const size_t es = loom_datatype_size(dt);
    unsigned char *sb[64], *rb[64];
    loom_request_t req[64];
    for (int r = 0; r < p; r++) {
        loomi_comm_force_algo(comms[r], LOOMI_COLL_BROADCAST, LOOMI_ALGO_SHARED);
        sb[r] = malloc(n * es + 1);
        rb[r] = malloc(n * es + 1);
        memset(rb[r], 0xee, n * es);
        unsigned char *in = inplace ? rb[r] : sb[r];
        for (size_t i = 0; r == root && i < n; i++) put_input(in, i, r, dt);
        cr_assert_eq(loom_ibroadcast(r == root ? in : NULL, rb[r], n, dt, root, comms[r],
                                     &req[r]),
                     LOOM_SUCCESS, "%s", loom_get_last_error());
    }
    run_world(w, comms, req, H, L, n);
    int bad = 0;
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < n && !bad; i++) {
            const double want = (double)((root + 1) * (int)(i % 7 + 1));
            if (get_elem(rb[r], i, dt) != want) {
                cr_log_error("bcast %dx%d n=%zu inplace=%d root %d rank %d [%zu] = %g, want %g",
                             H, L, n, inplace, root, r, i, get_elem(rb[r], i, dt), want);
                bad++;
            }
        }
    close_world(w, comms, p, sb, rb);
    return bad;
}

Test(shared, broadcast_in_and_out_of_place)
{
    cr_assert_eq(blocks_sweep(run_bc, 31), 0);
}

/* Past LOOM_SHM_STREAM (read once per process: set before any world) the
 * copies into RECV stream, at offsets of any alignment; the broadcast's
 * root also streams its RECV in the copy into its arena. */
Test(shared, allgather_and_broadcast_stream_past_the_threshold)
{
    setenv("LOOM_SHM_STREAM", "4096", 1);
    int bad = 0;
    for (int ip = 0; ip < 2; ip++) {
        bad += run_ag(1, 3, 0, 100003, ip, LOOM_SUM, LOOM_INT32, 65536, 5);
        bad += run_ag(1, 4, 0, 4099, ip, LOOM_SUM, LOOM_FLOAT32, 65536, 8);
        bad += run_bc(1, 3, 0, 100003, ip, LOOM_SUM, LOOM_INT32, 65536, 5);
        bad += run_bc(1, 4, 0, 40099, ip, LOOM_SUM, LOOM_FLOAT32, 65536, 6);
    }
    cr_assert_eq(bad, 0);
}

/* Operations through the arenas run one after another in the order they
 * were posted (the engine's queue of shared operations): a reduce-scatter,
 * an allgather and a broadcast posted back to back, each in several
 * rounds, all come out right. */
Test(shared, posted_operations_take_turns_on_the_arenas)
{
    const int L = 3;
    const size_t n = 30011;
    loom_comm_t comms[64];
    struct loomi_sim_world *w = open_world(1, L, 0, 65536, 41, comms);
    float *in[3], *rs[3], *ag[3], *bc[3];
    loom_request_t req[3][3];
    for (int r = 0; r < L; r++) {
        for (int c = LOOMI_COLL_REDUCE_SCATTER; c <= LOOMI_COLL_BROADCAST; c++)
            if (c != LOOMI_COLL_ALLTOALL && c != LOOMI_COLL_ALLTOALLV)
                loomi_comm_force_algo(comms[r], c, LOOMI_ALGO_SHARED);
        in[r] = malloc((size_t)L * n * sizeof(float));
        rs[r] = malloc(n * sizeof(float));
        ag[r] = malloc((size_t)L * n * sizeof(float));
        bc[r] = malloc(n * sizeof(float));
        for (size_t i = 0; i < (size_t)L * n; i++) put_input(in[r], i, r, LOOM_FLOAT32);
        cr_assert_eq(loom_ireduce_scatter(in[r], rs[r], n, LOOM_FLOAT32, LOOM_SUM, comms[r],
                                          &req[0][r]),
                     LOOM_SUCCESS);
        cr_assert_eq(loom_iallgather(in[r], ag[r], n, LOOM_FLOAT32, comms[r], &req[1][r]),
                     LOOM_SUCCESS);
        cr_assert_eq(loom_ibroadcast(r == 1 ? in[r] : NULL, bc[r], n, LOOM_FLOAT32, 1,
                                     comms[r], &req[2][r]),
                     LOOM_SUCCESS);
    }
    for (int k = 0; k < 3; k++) run_world(w, comms, req[k], 1, L, n);
    for (int r = 0; r < L; r++)
        for (size_t i = 0; i < n; i++) {
            cr_assert_eq(rs[r][i], want_at((size_t)r * n + i, L, LOOM_SUM, LOOM_FLOAT32),
                         "reduce-scatter rank %d [%zu]", r, i);
            cr_assert_eq(bc[r][i], (float)(2 * (int)(i % 7 + 1)), "broadcast rank %d [%zu]", r,
                         i);
            for (int q = 0; q < L; q++)
                cr_assert_eq(ag[r][(size_t)q * n + i], (float)((q + 1) * (int)(i % 7 + 1)),
                             "allgather rank %d block %d [%zu]", r, q, i);
        }
    loomi_sim_world_destroy(w, comms);
    for (int r = 0; r < L; r++) {
        free(in[r]);
        free(rs[r]);
        free(ag[r]);
        free(bc[r]);
    }
}

/* Which blocking calls take the arenas' slots (small.c): each of the four
 * collectives that put data there stops at its own measured limit, in
 * bytes of slot (the input of allreduce and allgather, every rank's block
 * of reduce-scatter and all-to-all); the allreduce of a slow reduction
 * at the limit measured for those; the barrier at the slot size;
 * broadcast never; nothing with LOOM_ALGO set for the collective. */
#define FITS(coll, n) loomi_small_fits(&c, coll, n, LOOM_FLOAT32, LOOM_SUM)
Test(shared, small_calls_stop_at_their_own_limit)
{
    struct loom_comm c;
    memset(&c, 0, sizeof c);
    c.nranks = 4;
    c.small_max = 64 << 10;
    const size_t lim[LOOMI_SMALL_TUNED] = {2048, 8192, 4096, 0};
    for (int k = 0; k < LOOMI_SMALL_TUNED; k++) c.small_lim[k] = lim[k];
    c.small_lim_red[1] = 1024;
    c.small_lim_red[3] = 512;
    c.red.cls[LOOM_BFLOAT16][LOOM_SUM] = c.red.cls[LOOM_BFLOAT16][LOOM_AVG] = 1;
    c.red.cls[LOOM_BFLOAT16][LOOM_MAX] = 3;
    /* n: count times the element size, as collectives.c passes it. */
    cr_assert(FITS(LOOMI_COLL_ALLREDUCE, 2048));
    cr_assert(!FITS(LOOMI_COLL_ALLREDUCE, 2049));
    cr_assert(loomi_small_fits(&c, LOOMI_COLL_ALLREDUCE, 2048, LOOM_BFLOAT16, LOOM_MIN),
              "bf16 min is not slow here");
    cr_assert(loomi_small_fits(&c, LOOMI_COLL_ALLREDUCE, 1024, LOOM_BFLOAT16, LOOM_AVG));
    cr_assert(!loomi_small_fits(&c, LOOMI_COLL_ALLREDUCE, 1026, LOOM_BFLOAT16, LOOM_AVG),
              "slow reductions stop at their class's limit");
    cr_assert(loomi_small_fits(&c, LOOMI_COLL_ALLREDUCE, 512, LOOM_BFLOAT16, LOOM_MAX));
    cr_assert(!loomi_small_fits(&c, LOOMI_COLL_ALLREDUCE, 514, LOOM_BFLOAT16, LOOM_MAX));
    cr_assert(loomi_small_fits(&c, LOOMI_COLL_REDUCE_SCATTER, 8192 / 4, LOOM_BFLOAT16, LOOM_MAX),
              "only the allreduce reduces every peer's whole vector");
    cr_assert(loomi_small_fits(&c, LOOMI_COLL_ALLREDUCE, 2048, (loom_datatype_t)99, LOOM_SUM),
              "an invalid datatype is not slow, and reads nothing out of range");
    cr_assert(FITS(LOOMI_COLL_REDUCE_SCATTER, 8192 / 4));
    cr_assert(!FITS(LOOMI_COLL_REDUCE_SCATTER, 8192 / 4 + 1));
    cr_assert(FITS(LOOMI_COLL_ALLGATHER, 4096));
    cr_assert(!FITS(LOOMI_COLL_ALLGATHER, 4097));
    cr_assert(!FITS(LOOMI_COLL_ALLTOALL, 4), "limit 0: never");
    cr_assert(FITS(LOOMI_COLL_BARRIER, 0));
    cr_assert(!FITS(LOOMI_COLL_BROADCAST, 8));
    c.algo_forced[LOOMI_COLL_ALLGATHER] = LOOMI_ALGO_RING;
    cr_assert(!FITS(LOOMI_COLL_ALLGATHER, 8), "LOOM_ALGO bypasses the slots");
    c.small_max = 0;
    cr_assert(!FITS(LOOMI_COLL_ALLREDUCE, 8), "no slots at all");
    cr_assert(!FITS(LOOMI_COLL_BARRIER, 0));
}
#undef FITS

/* The allreduce's algorithm (algo.c): each class of reductions from its
 * own table, fp32 sums (class 0) and invalid pairs from the main one;
 * the other collectives and the windows' table whatever the datatype;
 * LOOM_ALGO over all of them. */
Test(shared, slower_reductions_take_their_class_table)
{
    static struct loomi_selection sel;
    memset(&sel, 0, sizeof sel);
    const int AR = LOOMI_COLL_ALLREDUCE, RS = LOOMI_COLL_REDUCE_SCATTER;
    cr_assert_eq(loomi_ranges_set(&sel.coll[AR], 0, 0, LOOMI_ALGO_RING), 0);
    cr_assert_eq(loomi_ranges_set(&sel.coll[AR], 4096, 8192, LOOMI_ALGO_RECURSIVE_DOUBLING), 0);
    for (int k = 0; k < LOOMI_RED_CLASSES; k++)
        cr_assert_eq(loomi_ranges_set(&sel.allreduce_red[k], 0, 0, LOOMI_ALGO_RING), 0);
    cr_assert_eq(loomi_ranges_set(&sel.allreduce_red[3], 4096, 8192, LOOMI_ALGO_TREE), 0);
    cr_assert_eq(loomi_ranges_set(&sel.coll[RS], 0, 0, LOOMI_ALGO_HALVING_DOUBLING), 0);
    cr_assert_eq(loomi_ranges_set(&sel.window[0], 0, 0, LOOMI_ALGO_SHARED), 0);
    struct loom_comm c;
    memset(&c, 0, sizeof c);
    c.nranks = 4;
    c.sel = &sel;
    c.red.cls[LOOM_BFLOAT16][LOOM_MAX] = 3;
    c.red.cls[LOOM_BFLOAT16][LOOM_SUM] = 2;
    cr_assert_eq(loomi_algo_for(&c, AR, 4096, 0, LOOM_FLOAT32, LOOM_SUM, NULL),
                 LOOMI_ALGO_RECURSIVE_DOUBLING);
    cr_assert_eq(loomi_algo_for(&c, AR, 4096, 0, LOOM_BFLOAT16, LOOM_MAX, NULL), LOOMI_ALGO_TREE,
                 "class 3 runs its own table's span");
    cr_assert_eq(loomi_algo_for(&c, AR, 8192, 0, LOOM_BFLOAT16, LOOM_MAX, NULL), LOOMI_ALGO_RING);
    cr_assert_eq(loomi_algo_for(&c, AR, 4096, 0, LOOM_BFLOAT16, LOOM_SUM, NULL), LOOMI_ALGO_RING,
                 "class 2's table has no span there");
    cr_assert_eq(loomi_algo_for(&c, AR, 4096, 1, (loom_datatype_t)42, LOOM_MAX, NULL),
                 LOOMI_ALGO_RECURSIVE_DOUBLING, "an invalid datatype as class 0");
    cr_assert_eq(loomi_algo_for(&c, RS, 4096, 0, LOOM_BFLOAT16, LOOM_MAX, NULL),
                 LOOMI_ALGO_HALVING_DOUBLING, "only the allreduce has classes");
    c.win_shared = 1;
    cr_assert_eq(loomi_algo_for(&c, AR, 4096, 0, LOOM_BFLOAT16, LOOM_MAX, NULL), LOOMI_ALGO_SHARED,
                 "windows keep their table");
    c.win_shared = 0;
    c.algo_forced[AR] = LOOMI_ALGO_HALVING_DOUBLING;
    cr_assert_eq(loomi_algo_for(&c, AR, 4096, 0, LOOM_BFLOAT16, LOOM_MAX, NULL),
                 LOOMI_ALGO_HALVING_DOUBLING, "LOOM_ALGO rules");
}

/* The chunk the table names comes with its algorithm (algo.c), from
 * whichever table serves the call; LOOM_ALGO's algorithms run in
 * LOOM_CHUNK_SIZE's chunks (0 here), which the model did not weigh. */
Test(shared, the_tables_chunk_comes_with_its_algorithm)
{
    static struct loomi_selection sel;
    memset(&sel, 0, sizeof sel);
    const int AR = LOOMI_COLL_ALLREDUCE, RD = LOOMI_COLL_REDUCE;
    sel.coll[RD].n = 2;
    sel.coll[RD].r[0] = (struct loomi_range){.from = 0, .algo = LOOMI_ALGO_TREE};
    sel.coll[RD].r[1] = (struct loomi_range){
        .from = (size_t)1 << 20, .algo = LOOMI_ALGO_SCATTER_ALLGATHER, .chunk = (size_t)256 << 10};
    sel.allreduce_red[2].n = 1;
    sel.allreduce_red[2].r[0] = (struct loomi_range){.algo = LOOMI_ALGO_RING, .chunk = 65536};
    cr_assert_eq(loomi_ranges_set(&sel.coll[AR], 0, 0, LOOMI_ALGO_RING), 0);
    struct loom_comm c;
    memset(&c, 0, sizeof c);
    c.nranks = 4;
    c.sel = &sel;
    c.red.cls[LOOM_BFLOAT16][LOOM_SUM] = 2;
    size_t ch = 1;
    cr_assert_eq(loomi_algo_for(&c, RD, 4096, 0, LOOM_FLOAT32, LOOM_SUM, &ch), LOOMI_ALGO_TREE);
    cr_assert_eq(ch, 0);
    cr_assert_eq(loomi_algo_for(&c, RD, (size_t)8 << 20, 0, LOOM_FLOAT32, LOOM_SUM, &ch),
                 LOOMI_ALGO_SCATTER_ALLGATHER);
    cr_assert_eq(ch, (size_t)256 << 10);
    cr_assert_eq(loomi_algo_for(&c, AR, (size_t)8 << 20, 0, LOOM_BFLOAT16, LOOM_SUM, &ch),
                 LOOMI_ALGO_RING);
    cr_assert_eq(ch, 65536, "the class's table's chunk");
    cr_assert_eq(loomi_algo_for(&c, AR, (size_t)8 << 20, 0, LOOM_FLOAT32, LOOM_SUM, &ch),
                 LOOMI_ALGO_RING);
    cr_assert_eq(ch, 0);
    /* A tuned span (loomi_ranges_set) keeps the chunks around it. */
    cr_assert_eq(loomi_ranges_set(&sel.coll[RD], (size_t)2 << 20, (size_t)4 << 20,
                                  LOOMI_ALGO_TREE), 0);
    cr_assert_eq(loomi_algo_for(&c, RD, (size_t)3 << 20, 0, LOOM_FLOAT32, LOOM_SUM, &ch),
                 LOOMI_ALGO_TREE);
    cr_assert_eq(ch, 0);
    cr_assert_eq(loomi_algo_for(&c, RD, (size_t)4 << 20, 0, LOOM_FLOAT32, LOOM_SUM, &ch),
                 LOOMI_ALGO_SCATTER_ALLGATHER);
    cr_assert_eq(ch, (size_t)256 << 10, "the span after the tuned one keeps its chunk");
    cr_assert_eq(loomi_algo_for(&c, RD, (size_t)1 << 20, 0, LOOM_FLOAT32, LOOM_SUM, &ch),
                 LOOMI_ALGO_SCATTER_ALLGATHER);
    cr_assert_eq(ch, (size_t)256 << 10, "and the one before");
    c.algo_forced[RD] = LOOMI_ALGO_SCATTER_ALLGATHER;
    cr_assert_eq(loomi_algo_for(&c, RD, (size_t)8 << 20, 0, LOOM_FLOAT32, LOOM_SUM, &ch),
                 LOOMI_ALGO_SCATTER_ALLGATHER);
    cr_assert_eq(ch, 0, "LOOM_ALGO: LOOM_CHUNK_SIZE's chunks");
}

/* ------------------------------------------------ failure while a step is ready */

/* A transport over the sim whose arenas are mappings of one memfd per
 * rank, one per rank that maps it, as the shm transport's are, and whose
 * abort_all on rank 0 takes its mappings of the peers' arenas away, as
 * the shm transport's did: a failure reported from inside progress(),
 * right after a message that makes a shared step ready, must not let
 * rank 0 run that step (it would read memory the transport gave up). */
#define FX_MAX 4
static struct {
    const struct loomi_transport_ops *real;
    struct loomi_transport_ops ops;
    int n;
    void *state[FX_MAX];
    struct loom_comm *comm0;
    unsigned char *map[FX_MAX][FX_MAX]; /* map[r][q]: rank r's mapping of rank q's arena */
    size_t len;
    int inject_at, injected, completions;
    void (*engine_complete)(struct loomi_xfer *, loom_result_t);
} fx;

static int fx_rank(void *st)
{
    for (int r = 0; r < fx.n; r++)
        if (st == fx.state[r]) return r;
    return -1;
}

static void fx_complete(struct loomi_xfer *x, loom_result_t status)
{
    if (status == LOOM_SUCCESS) fx.completions++;
    fx.engine_complete(x, status);
}

static loom_result_t fx_irecv(void *st, struct loomi_xfer *x)
{
    if (fx_rank(st) == 0) {
        fx.engine_complete = x->complete;
        x->complete = fx_complete;
    }
    return fx.real->irecv(st, x);
}

static loom_result_t fx_progress(void *st, int ms)
{
    loom_result_t r = fx.real->progress(st, ms);
    if (fx_rank(st) == 0 && !fx.injected && fx.completions >= fx.inject_at) {
        fx.injected = 1;
        loomi_comm_on_peer_failed(fx.comm0, 1, 1, LOOM_ERR_REMOTE, "injected by the test");
    }
    return r;
}

static void fx_abort_all(void *st, int failed, loom_result_t code)
{
    fx.real->abort_all(st, failed, code);
    if (fx_rank(st) == 0)
        for (int q = 1; q < fx.n; q++) mprotect(fx.map[0][q], fx.len, PROT_NONE);
}

static void *fx_shared_map(void *st, int q, size_t *len)
{
    int r = fx_rank(st);
    if (r < 0 || q < 0 || q >= fx.n) return NULL;
    *len = fx.len;
    return fx.map[r][q];
}

/* Two ranks on one host: rank 1 sends rank 0 a message; rank 0's only
 * other step, which the message makes ready, copies from rank 1's
 * arena.  Rank 0 hears of a failure in the progress call that
 * completes the receive, when nothing else of its operation is posted
 * (so failing the posted transfers fails nothing). */
Test(shared, a_failure_found_in_progress_stops_the_shared_steps)
{
    loom_comm_t comms[2];
    struct loomi_sim_world *w = open_world(1, 2, 0, 65536, 11, comms);
    struct loom_comm *c[2] = {loomi_comm_get(comms[0]), loomi_comm_get(comms[1])};
    memset(&fx, 0, sizeof fx);
    fx.n = 2;
    fx.inject_at = 1;
    fx.real = c[0]->eng.tops;
    fx.ops = *fx.real;
    fx.ops.irecv = fx_irecv;
    fx.ops.progress = fx_progress;
    fx.ops.abort_all = fx_abort_all;
    fx.ops.shared_map = fx_shared_map;
    size_t want = 0;
    cr_assert_not_null(fx.real->shared_map(c[0]->eng.tstate, 0, &want));
    fx.len = (want + 4095) / 4096 * 4096;
    for (int q = 0; q < 2; q++) {
        int fd = memfd_create("loom-test-arena", 0);
        cr_assert(fd >= 0 && ftruncate(fd, (off_t)fx.len) == 0);
        for (int r = 0; r < 2; r++) {
            fx.map[r][q] = mmap(NULL, fx.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            cr_assert(fx.map[r][q] != MAP_FAILED);
        }
        close(fd);
    }
    fx.comm0 = c[0];
    for (int r = 0; r < 2; r++) {
        fx.state[r] = c[r]->eng.tstate;
        c[r]->eng.tops = &fx.ops;
    }
    const size_t n = 1024;
    memset(fx.map[1][1], 0x3f, n * 4); /* rank 1's arena, as it wrote it */
    float *b[2];
    loom_request_t req[2];
    for (int r = 0; r < 2; r++) {
        b[r] = calloc(n, sizeof *b[r]);
        struct loomi_sched sc;
        cr_assert_eq(loomi_sched_init(&sc, r, 2, LOOM_FLOAT32, LOOM_SUM), 0);
        sc.nshared = 2;
        sc.shared_bytes = n * 4;
        sc.buf_bytes[LOOMI_BUF_SEND] = sc.buf_bytes[LOOMI_BUF_RECV] = n * 4;
        if (r == 0) {
            uint32_t rv = loomi_sched_recv(&sc, 1, 1, LOOMI_BUF_RECV, 0, n, NULL, 0);
            loomi_sched_copy(&sc, LOOMI_BUF_RECV, 0, LOOMI_BUF_SHARED + 1, 0, n, &rv, 1);
        } else {
            loomi_sched_send(&sc, 0, 1, LOOMI_BUF_SEND, 0, n, NULL, 0);
        }
        cr_assert_eq(loomi_sched_finish(&sc), LOOM_SUCCESS, "%s", loom_get_last_error());
        struct loomi_op *op;
        uintptr_t rh = loomi_handle_new(LOOMI_HANDLE_REQUEST, NULL);
        cr_assert_neq(rh, 0);
        cr_assert_eq(loomi_op_start(&c[r]->eng, &sc, b[r], b[r], 0, &op), LOOM_SUCCESS, "%s",
                     loom_get_last_error());
        loomi_op_set_request(op, rh);
        req[r] = (loom_request_t)rh;
    }
    loom_result_t res[2];
    char msg[256];
    cr_assert_eq(loomi_sim_run(w, comms, req, 2, 1000000, res, msg, sizeof msg), LOOM_SUCCESS,
                 "%s", msg);
    cr_assert_eq(fx.injected, 1, "the failure was injected");
    cr_assert_eq(res[0], LOOM_ERR_REMOTE, "rank 0: %s", msg);
    loomi_sim_world_destroy(w, comms);
    for (int r = 0; r < 2; r++) {
        free(b[r]);
        for (int q = 0; q < 2; q++) munmap(fx.map[r][q], fx.len);
    }
}
