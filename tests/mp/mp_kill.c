/*
 * mp_kill.c - one rank of the kill test.
 *
 * All ranks start a large allreduce; the victim rank waits until the
 * operation is under way, notes the time and SIGKILLs itself.  Every
 * survivor must see the operation fail (never succeed, never hang) with
 * an error, and report how long after the kill it did.  The communicator
 * must then refuse further work with LOOM_ERR_REVOKED.
 *
 * With MODE "stop" the victim SIGSTOPs itself instead: it stays alive but
 * silent, and the survivors must fail once LOOM_TIMEOUT passes without
 * progress (the neighbours by their deadline, the rest at once when the
 * neighbours abort).  Rank 0 then kills the stopped victim.
 *
 * With MODE "revoke" the victim calls loom_comm_revoke instead, once the
 * operation is under way, and then waits for its own call: every rank,
 * the victim too, must fail with its in-place buffer as it was.
 *
 * With COLL "alltoall" the operation is an in-place all-to-all instead
 * (its input is staged in scratch, which is also what restores it).
 *
 * With COLL "reduce_scatter" it is an in-place reduce-scatter of blocks
 * of COUNT/n floats (on one host with LOOM_ALGO=reduce_scatter:shared,
 * through the arenas): the survivors must put back the block they were
 * writing results into, and leave the others untouched.
 *
 * With COLL "allgather" it is an in-place allgather of blocks of
 * COUNT/n floats: the survivors' own blocks, their input, must be as
 * they were; the blocks the operation was filling are unspecified
 * (loom_allgather(3)), and with a long enough drive some hold peers'
 * values, which the survivor reports.
 *
 * With COLL "broadcast" it is an in-place broadcast of COUNT floats from
 * rank 0: the root's buffer, the input, must be as it was; the others'
 * are unspecified.
 *
 * With COLL "small" every rank runs blocking in-place allreduces of COUNT
 * floats in a loop, each checked, and the victim dies between two of
 * them: on one host these take the slots of the shared arenas (small.c),
 * where the survivors wait on the victim's slot, not on a message.
 *
 * DRIVE_MS (default 1) is how long the victim drives the operation before
 * it dies: longer, and the survivors have overwritten part of their
 * in-place buffers with results, which they must put back.  "fF" (F in
 * 0..1) instead drives it until the element at fraction F of the
 * victim's own in-place buffer holds its result: the kill then comes
 * at that phase of the operation, however fast the host runs it.
 *
 * PATTERN "pattern" gives every element its own value (rank + 1 plus
 * the index mod 4093): a restore that puts back bytes from the wrong
 * place, or misses a range, shows.
 *
 * With BUFFER "window" the buffer is a loom_mem_alloc window: the shared
 * allreduce reads the peers' buffers in place, and the survivors must put
 * back what their reductions and copies overwrote (LOOMI_RS_SAVE,
 * LOOMI_COPY_SAVE) while the victim's window stays mapped in them.
 *
 * With BUFFER "window-oop" the allreduce is out of place, from the first
 * half of a window into the second: on one host every rank writes its
 * reduced slice straight into the peers' windows (LOOMI_RS_PUSH).  Once
 * the operation has failed on a survivor, nobody may write into its
 * buffer any more: it fills its output with a pattern at once, waits
 * 300 ms, and the pattern must still be there.  A peer still pushing the
 * failed operation's results would overwrite it.
 *
 * usage: mp_kill VICTIM_RANK STAMP_FILE [COUNT [kill|stop|revoke [allreduce|alltoall|reduce_scatter|allgather|broadcast|small
 *        [DRIVE_MS
 *        [heap|window|window-oop [pattern]]]]]]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"
#include "check.h"

/* The value of element i on `rank` in round `round` before the call. */
static int pattern;
static float value(int rank, int round, size_t i)
{
    return (float)(rank + 1 + round) + (pattern ? (float)(i % 4093) : 0.0f);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A survivor leaves its mark; the victim waits (at most 10 s) for all. */
static void ready(const char *stamp, int rank, int victim, int n)
{
    char mark[4096];
    if (rank != victim) {
        snprintf(mark, sizeof mark, "%s.ready.%d", stamp, rank);
        FILE *m = fopen(mark, "w");
        if (m) fclose(m);
        return;
    }
    for (int q = 0, tries = 0; q < n && tries < 2000; q++) {
        if (q == victim) continue;
        snprintf(mark, sizeof mark, "%s.ready.%d", stamp, q);
        while (access(mark, F_OK) != 0 && tries++ < 2000) usleep(5000);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mp_kill VICTIM STAMP_FILE [COUNT]\n");
        return 2;
    }
    int victim = atoi(argv[1]);
    const char *stamp = argv[2];
    size_t count = argc > 3 ? strtoull(argv[3], NULL, 10) : 16u << 20;
    int stop = argc > 4 && !strcmp(argv[4], "stop");
    int revoke = argc > 4 && !strcmp(argv[4], "revoke");
    int a2a = argc > 5 && !strcmp(argv[5], "alltoall");
    int small = argc > 5 && !strcmp(argv[5], "small");
    int rs = argc > 5 && !strcmp(argv[5], "reduce_scatter");
    int ag = argc > 5 && !strcmp(argv[5], "allgather");
    int bc = argc > 5 && !strcmp(argv[5], "broadcast");
    loom_comm_t comm;
    int rank, n;
    mp_join(&comm, &rank, &n);
    if (a2a) count -= count % (size_t)n;
    const int oop = argc > 7 && !strcmp(argv[7], "window-oop");
    const int win = oop || (argc > 7 && !strcmp(argv[7], "window"));
    pattern = argc > 8 && !strcmp(argv[8], "pattern");
    float *buf = NULL, *out = NULL;
    if (!win) {
        buf = malloc(count * sizeof *buf);
    } else if (loom_mem_alloc(comm, (oop ? 2 : 1) * count * sizeof *buf, (void **)&buf) !=
               LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: loom_mem_alloc: %s\n", rank, loom_get_last_error());
        return 2;
    }
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    out = oop ? buf + count : buf;
    /* One full operation first: every connection is proven to work. */
    if (loom_allreduce(buf, buf, count < 1024 ? count : 1024, LOOM_FLOAT32, LOOM_SUM, comm) !=
        LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: warm-up failed: %s\n", rank, loom_get_last_error());
        return 2;
    }
    /* The warm-up may end on the victim while a survivor is still in it;
     * a kill then would fail the warm-up, not the operation under test.
     * Nor may a survivor still be filling its buffer when the failure is
     * known, or its submission, not the operation, fails.  So every
     * survivor says when it has posted the operation (a file; for "small",
     * when it is through the warm-up), and the victim waits for all of
     * them before it starts. */
    /* rank + 1: never 0, which a failed restore from fresh memory would
     * leave looking right on rank 0. */
    for (size_t i = 0; i < count; i++) buf[i] = value(rank, 0, i);
    if (small || rank == victim) ready(stamp, rank, victim, n);
    loom_request_t req = LOOM_REQUEST_NULL;
    loom_result_t r = LOOM_SUCCESS;
    int round = 0;
    if (small) {
        /* Round k's input is rank + 1 + k; the sum is n(n+1)/2 + n k. */
        for (;; round++) {
            if (rank == victim && round == 200) break;
            for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1 + round);
            r = loom_allreduce(buf, buf, count, LOOM_FLOAT32, LOOM_SUM, comm);
            if (r != LOOM_SUCCESS) break;
            float want = (float)(n * (n + 1) / 2 + n * round);
            for (size_t i = 0; i < count; i++)
                if (buf[i] != want) {
                    printf("rank %d: WRONG: round %d element %zu is %g, not %g\n", rank, round,
                           i, buf[i], want);
                    return 1;
                }
            if (rank != victim && round > 100000) {
                printf("rank %d: WRONG: the victim's death went unnoticed\n", rank);
                return 1;
            }
        }
    } else {
        const size_t blk = count / (size_t)n;
        r = a2a  ? loom_ialltoall(buf, buf, blk, LOOM_FLOAT32, comm, &req)
            : rs ? loom_ireduce_scatter(buf, buf + (size_t)rank * blk, blk, LOOM_FLOAT32,
                                        LOOM_SUM, comm, &req)
            : ag ? loom_iallgather(buf + (size_t)rank * blk, buf, blk, LOOM_FLOAT32, comm, &req)
            : bc ? loom_ibroadcast(buf, buf, count, LOOM_FLOAT32, 0, comm, &req)
                 : loom_iallreduce(buf, out, count, LOOM_FLOAT32, LOOM_SUM, comm, &req);
        if (r != LOOM_SUCCESS) {
            fprintf(stderr, "rank %d: submission failed: %s\n", rank, loom_get_last_error());
            return 2;
        }
        if (rank != victim) ready(stamp, rank, victim, n);
    }
    if (rank == victim) {
        /* Drive the operation until it is well under way, then die. */
        double t0 = now_ms();
        int done = 0;
        /* An all-to-all rank depends only on its own exchanges, which can
         * finish fast: die sooner so that most survivors see the loss. */
        /* Long enough to be under way, short enough not to finish even
         * over shared memory. */
        double drive_ms = argc > 6 ? atof(argv[6]) : 1;
        if (argc > 6 && argv[6][0] == 'f') {
            /* Until that element holds a result (another rank may be
             * writing it: read it through a volatile pointer). */
            size_t at = (size_t)(atof(argv[6] + 1) * (double)(count - 1));
            const volatile float *e = buf + (at < count ? at : count - 1);
            const float was = value(rank, 0, (size_t)(e - buf));
            while (!small && *e == was && !done && now_ms() - t0 < 20000)
                loom_test(&req, &done);
        } else
            while (!small && !stop && now_ms() - t0 < drive_ms && !done) loom_test(&req, &done);
        if (done) {
            fprintf(stderr, "victim: the operation finished before the kill; use a larger count\n");
            return 2;
        }
        FILE *f = fopen(stamp, "w");
        fprintf(f, "%.3f %d\n", now_ms(), (int)getpid());
        fclose(f);
        if (revoke) {
            if (loom_comm_revoke(comm) != LOOM_SUCCESS) {
                fprintf(stderr, "victim: revoke failed: %s\n", loom_get_last_error());
                return 2;
            }
        } else {
            kill(getpid(), stop ? SIGSTOP : SIGKILL);
            return 1;
        }
    }
    if (!small) r = loom_wait(&req);
    double t_err = now_ms();
    char msg[512];
    snprintf(msg, sizeof msg, "%s", loom_get_last_error());
    /* The in-place buffer must hold what it held before the call; an
     * output buffer must stay as this rank leaves it after the call. */
    size_t changed = 0;
    if (oop) {
        for (size_t i = 0; i < count; i++) out[i] = -1.0f;
        usleep(300000);
        for (size_t i = 0; i < count; i++) changed += out[i] != -1.0f;
    }
    /* An allgather's input is its own block, a broadcast's the root's
     * buffer; the rest was being filled. */
    const size_t from = ag ? (size_t)rank * (count / (size_t)n) : 0;
    const size_t to = ag ? from + count / (size_t)n : bc && rank ? 0 : count;
    size_t filled = 0;
    for (size_t i = 0; i < count; i++) {
        const int differs = buf[i] != value(rank, round, i);
        if (i >= from && i < to) changed += differs;
        else filled += differs;
    }
    FILE *f = NULL;
    for (int i = 0; i < 500 && !(f = fopen(stamp, "r")); i++) usleep(10000);
    double t_kill = 0;
    int vpid = 0;
    if (f) {
        if (fscanf(f, "%lf %d", &t_kill, &vpid) != 2) t_kill = 0;
        fclose(f);
    }
    int failed_rank = -2;
    loom_result_t ce = loom_comm_get_error(comm, &failed_rank);
    float x = 1;
    loom_result_t again = loom_allreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, comm);
    /* A killed victim must be named by every survivor, not a neighbour
     * that aborted; a silent one is found by deadline, which can only
     * guess (heartbeats will tell), so some rank must be named. */
    int named = revoke ? 1 : stop ? failed_rank >= 0 && failed_rank < n : failed_rank == victim;
    int good = r != LOOM_SUCCESS && ce != LOOM_SUCCESS && again == LOOM_ERR_REVOKED &&
               changed == 0 && t_kill > 0 && named;
    /* A survivor whose all-to-all exchanges all finished before the kill
     * has a complete, correct result: block q holds rank q's values. */
    if (a2a && r == LOOM_SUCCESS) {
        size_t wrong = 0, blk = count / (size_t)n;
        for (size_t i = 0; i < count; i++) wrong += buf[i] != (float)(i / blk + 1);
        good = wrong == 0 && t_kill > 0;
        changed = wrong;
    }
    /* So has a survivor whose in-place allreduce finished: a victim
     * stopped or killed late may have delivered all this rank needed
     * (on 4 ranks with windows, its last writes can land after the
     * element it watched).  The script retries a case in which no
     * survivor failed, since such a run tests no restore. */
    int finished = 0;
    if (!a2a && !small && !rs && !ag && !bc && !oop && r == LOOM_SUCCESS) {
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++) {
            float want = (float)(n * (n + 1) / 2) + (pattern ? (float)n * (float)(i % 4093) : 0.0f);
            wrong += buf[i] != want;
        }
        finished = wrong == 0;
        good = finished && t_kill > 0;
        changed = wrong;
    }
    printf("rank %d: %s after %.1f ms: %s [%s]; failed rank %d; %s: %s (%zu "
           "elements %s); later op: %s",
           rank, good ? "OK" : "WRONG", t_err - t_kill, loom_strerror(r), msg, failed_rank,
           finished ? "finished before the loss, result correct" : "buffers intact",
           changed ? "NO" : "yes", changed, finished ? "wrong" : "changed",
           loom_strerror(again));
    if (ag || bc) printf("; %zu elements filled", filled);
    printf("\n");
    loom_comm_destroy(comm); /* unmaps a window */
    if (!win) free(buf);
    if (stop && rank == 0 && vpid > 0) kill(vpid, SIGKILL);
    return good ? 0 : 1;
}
