/*
 * mp_fault.c - one rank of the failure tests (detection, revocation,
 * shrink).
 *
 * Every rank loops allreduce (1M floats, each result checked) until an
 * operation fails.  What makes it fail depends on MODE:
 *   kill    the victim SIGKILLs itself during the third operation's
 *           neighbourhood (between two calls, so it may die while the
 *           others are already inside the next one);
 *   stop    the victim SIGSTOPs itself: alive, connections open, silent;
 *   idle    the victim SIGKILLs itself while the others compute (sleep,
 *           not in any Loom call); their next call must fail at once;
 *   revoke  the victim calls loom_comm_revoke instead of the next
 *           operation, and stays: nobody failed, the shrunk
 *           communicator keeps every rank;
 *   coord   like kill, and then rank VICTIM2 also dies while the others
 *           are shrinking (with VICTIM2 = 0, the shrink's coordinator).
 * The victim writes "MONOTONIC_MS PID" to STAMP just before it acts;
 * every survivor reports how long after that its operation failed, then
 * shrinks, checks the new communicator (size, its rank in the old order,
 * five checked allreduces) and prints
 *   "OK detect_ms=D shrink_ms=S size=N failed=LIST".
 * With "stop", the new rank 0 then sends SIGCONT to the victim, which
 * must find its communicator broken and be refused by shrink.
 *
 * usage: mp_fault MODE VICTIM STAMP [VICTIM2]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"
#include "check.h"

#define COUNT (1u << 20)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void stamp(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "%.3f %d\n", now_ms(), (int)getpid());
    fclose(f);
    rename(tmp, path);
}

static int read_stamp(const char *path, double *t, int *pid)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fscanf(f, "%lf %d", t, pid) == 2;
    fclose(f);
    return ok ? 0 : -1;
}

/* One allreduce of COUNT floats whose expected sum is known; 1 on a
 * wrong result, the error otherwise. */
static loom_result_t checked_allreduce(loom_comm_t comm, float *buf, float mine, float expect,
                                       int *wrong)
{
    for (size_t i = 0; i < COUNT; i++) buf[i] = mine + (float)(i % 7);
    loom_result_t r = loom_allreduce(buf, buf, COUNT, LOOM_FLOAT32, LOOM_SUM, comm);
    if (r != LOOM_SUCCESS) return r;
    int n;
    loom_comm_size(comm, &n);
    for (size_t i = 0; i < COUNT; i++)
        if (buf[i] != expect + (float)n * (float)(i % 7)) {
            *wrong = 1;
            break;
        }
    return r;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: mp_fault kill|stop|idle|revoke|coord|cut VICTIM STAMP [VICTIM2]\n");
        return 2;
    }
    const char *mode = argv[1];
    int victim = atoi(argv[2]);
    const char *stampf = argv[3];
    int victim2 = argc > 4 ? atoi(argv[4]) : -1;
    int revoke = !strcmp(mode, "revoke"), idle = !strcmp(mode, "idle");
    int stop = !strcmp(mode, "stop"), coord = !strcmp(mode, "coord");
    /* cut: the driver takes ranks VICTIM and VICTIM2's host off the
     * network (they stay alive); nobody acts from inside. */
    int cut = !strcmp(mode, "cut");
    loom_comm_t comm;
    int rank, n;
    mp_join(&comm, &rank, &n);
    float *buf = malloc(COUNT * sizeof *buf);
    float all = (float)n * (float)(n + 1) / 2; /* sum of rank + 1 */
    int wrong = 0, it;
    loom_result_t r = LOOM_SUCCESS;
    double t_fail = 0;
    for (it = 0; it < 10000 && r == LOOM_SUCCESS; it++) {
        if (rank == victim && it == 3 && !cut) {
            if (revoke) {
                usleep(100000); /* let the others block in the next operation */
                stamp(stampf);
                loom_comm_revoke(comm);
            } else if (idle) {
                usleep(300000); /* the others are computing */
                stamp(stampf);
                raise(SIGKILL);
            } else {
                stamp(stampf);
                raise(stop ? SIGSTOP : SIGKILL);
                /* SIGCONT: the others declared this rank failed meanwhile. */
                double t0 = now_ms();
                r = checked_allreduce(comm, buf, (float)(rank + 1), all, &wrong);
                loom_comm_t nc = NULL;
                loom_result_t rs = loom_comm_shrink(comm, &nc);
                if (r != LOOM_SUCCESS && rs != LOOM_SUCCESS && !nc)
                    printf("OK victim resumed: operation failed (%s) and shrink refused it "
                           "after %.0f ms (%s)\n",
                           loom_strerror(r), now_ms() - t0, loom_get_last_error());
                else
                    printf("FAIL victim resumed: operation %s, shrink %s\n", loom_strerror(r),
                           loom_strerror(rs));
                fflush(stdout);
                loom_comm_destroy(comm);
                free(buf);
                return 0;
            }
        }
        if (idle && it == 3) usleep(1000000); /* compute: no Loom call */
        r = checked_allreduce(comm, buf, (float)(rank + 1), all, &wrong);
        if (r != LOOM_SUCCESS) t_fail = now_ms();
        if (wrong) {
            printf("FAIL wrong result at iteration %d\n", it);
            return 1;
        }
    }
    if (r == LOOM_SUCCESS) {
        printf("FAIL no operation failed in %d iterations\n", it);
        return 1;
    }
    char err[512];
    snprintf(err, sizeof err, "%s", loom_get_last_error());
    double ts = 0;
    int vpid = 0;
    for (int tries = 0; read_stamp(stampf, &ts, &vpid) && tries < 100; tries++) usleep(10000);
    if (r != LOOM_ERR_REMOTE && r != LOOM_ERR_REVOKED) {
        printf("FAIL operation failed with %s, expected remote or revoked: %s\n",
               loom_strerror(r), err);
        return 1;
    }
    double detect = t_fail - ts;
    if (coord && rank == victim2) {
        usleep((useconds_t)(rank * 7000 % 30000)); /* die inside the others' shrink */
        raise(SIGKILL);
    }
    double t0 = now_ms();
    loom_comm_t nc = NULL;
    r = loom_comm_shrink(comm, &nc);
    double shrink = now_ms() - t0;
    if (cut && (rank == victim || rank == victim2)) {
        /* Cut off: the others look dead from here, and a minority may
         * not go on as the job (loom(7), LOOM_QUORUM): shrink refuses,
         * and comm stays broken. */
        int fr = -2;
        loom_result_t ge = loom_comm_get_error(comm, &fr);
        if (r == LOOM_ERR_REVOKED && strstr(loom_get_last_error(), "no majority") &&
            ge != LOOM_SUCCESS && !nc) {
            printf("OK minority detect_ms=%.1f shrink_ms=%.1f refused: %s\n", detect, shrink,
                   loom_get_last_error());
            fflush(stdout); /* before a sanitizer's exit report, whatever it says */
            if (nc) loom_comm_destroy(nc);
            loom_comm_destroy(comm);
            free(buf);
            return 0;
        }
        int nn = 0;
        if (nc) loom_comm_size(nc, &nn);
        printf("FAIL cut-off rank: shrink gave %s (%s), size %d of %d; get_error %s, rank %d\n",
               loom_strerror(r), loom_get_last_error(), nn, n, loom_strerror(ge), fr);
        return 1;
    }
    if (r != LOOM_SUCCESS) {
        printf("FAIL shrink: %s: %s\n", loom_strerror(r), loom_get_last_error());
        return 1;
    }
    int failed[64], nf = 0;
    loom_comm_get_failed(comm, failed, 64, &nf);
    int gone[64], ng = 0;
    if (!revoke) gone[ng++] = victim;
    if ((coord || cut) && victim2 >= 0 && victim2 != victim) gone[ng++] = victim2;
    int nrank, nn, expect_rank = 0;
    loom_comm_rank(nc, &nrank);
    loom_comm_size(nc, &nn);
    float sum = 0;
    for (int q = 0; q < n; q++) {
        int out = 0;
        for (int k = 0; k < ng; k++) out |= gone[k] == q;
        if (out) continue;
        if (q < rank) expect_rank++;
        sum += (float)(q + 1);
    }
    if (nn != n - ng || nrank != expect_rank || nf != ng) {
        printf("FAIL new communicator: rank %d of %d, expected %d of %d; %d failed known\n", nrank,
               nn, expect_rank, n - ng, nf);
        return 1;
    }
    for (int k = 0; k < 5; k++) {
        r = checked_allreduce(nc, buf, (float)(rank + 1), sum, &wrong);
        if (r != LOOM_SUCCESS || wrong) {
            printf("FAIL allreduce %d on the new communicator: %s %s\n", k, loom_strerror(r),
                   wrong ? "wrong result" : loom_get_last_error());
            return 1;
        }
    }
    /* The other survivors destroy the old communicator (a goodbye on its
     * control plane) before the new rank 0 asks again: the agreed set
     * stays what it was, the survivors are not listed. */
    if (nrank != 0) loom_comm_destroy(comm);
    loom_barrier(nc);
    if (nrank == 0) {
        usleep(100000); /* the goodbyes are in */
        int again[64], na = 0;
        loom_comm_get_failed(comm, again, 64, &na);
        if (na != nf || memcmp(again, failed, sizeof *failed * (size_t)nf)) {
            printf("FAIL loom_comm_get_failed after the survivors destroyed the old "
                   "communicator: %d ranks, first %d (was %d)\n",
                   na, na ? again[0] : -1, nf);
            return 1;
        }
    }
    char list[256] = "";
    for (int k = 0; k < nf; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", k ? "," : "", failed[k]);
    printf("OK detect_ms=%.1f shrink_ms=%.1f size=%d failed=%s (%s)\n", detect,
           shrink, nn, nf ? list : "-", err);
    fflush(stdout);
    /* Everyone is done with the new communicator before the victim wakes. */
    loom_barrier(nc);
    if (stop && nrank == 0 && vpid > 0) kill(vpid, SIGCONT);
    loom_comm_destroy(nc);
    if (nrank == 0) loom_comm_destroy(comm);
    free(buf);
    return 0;
}
