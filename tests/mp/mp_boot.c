/*
 * mp_boot.c - bootstrap checks.
 *
 *   mp_boot env             init from the environment, check a small allreduce
 *   mp_boot expect CODE MS [WORD...]
 *                           init from the environment must fail with CODE
 *                           (a loom_result_t number) within MS milliseconds,
 *                           with a message naming LOOM_ROOT's address (for
 *                           LOOM_ERR_CONNECT) and every WORD
 *   mp_boot train SECONDS   init from the environment, then a small allreduce
 *                           every 20 ms for SECONDS; the first error is
 *                           printed ("train: step S: CODE: message") and
 *                           exits 1
 *   mp_boot uid N           get a unique id, fork N ranks that join with
 *                           loom_comm_init_rank and check an allreduce
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int check_allreduce(loom_comm_t comm)
{
    int rank, n;
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &n);
    int64_t v[3] = {rank, 1, -rank};
    loom_result_t r = loom_allreduce(v, v, 3, LOOM_INT64, LOOM_SUM, comm);
    int64_t want = (int64_t)n * (n - 1) / 2;
    if (r != LOOM_SUCCESS || v[0] != want || v[1] != n || v[2] != -want) {
        fprintf(stderr, "rank %d: allreduce wrong (%s: %s)\n", rank, loom_strerror(r),
                loom_get_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "env")) {
        loom_comm_t comm;
        loom_result_t r = loom_comm_init_env(&comm, NULL);
        if (r != LOOM_SUCCESS) {
            fprintf(stderr, "init: %s: %s\n", loom_strerror(r), loom_get_last_error());
            return 1;
        }
        int bad = check_allreduce(comm);
        loom_comm_destroy(comm);
        return bad;
    }
    if (argc >= 3 && !strcmp(argv[1], "train")) {
        loom_comm_t comm;
        loom_result_t r = loom_comm_init_env(&comm, NULL);
        if (r != LOOM_SUCCESS) {
            printf("init: %s: %s\n", loom_strerror(r), loom_get_last_error());
            return 1;
        }
        double end = now_ms() + atof(argv[2]) * 1e3;
        int rank, n;
        loom_comm_rank(comm, &rank);
        loom_comm_size(comm, &n);
        for (long step = 0; now_ms() < end; step++) {
            int64_t v = rank + 1;
            r = loom_allreduce(&v, &v, 1, LOOM_INT64, LOOM_SUM, comm);
            if (r != LOOM_SUCCESS) {
                printf("train: step %ld: %s: %s\n", step, loom_strerror(r), loom_get_last_error());
                loom_comm_destroy(comm);
                return 1;
            }
            if (v != (int64_t)n * (n + 1) / 2) {
                printf("train: step %ld: sum %lld, not %lld\n", step, (long long)v,
                       (long long)n * (n + 1) / 2);
                return 1;
            }
            usleep(20000);
        }
        printf("train: done\n");
        loom_comm_destroy(comm);
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "expect")) {
        loom_result_t want = (loom_result_t)atoi(argv[2]);
        double limit = atof(argv[3]), t0 = now_ms();
        loom_comm_t comm = NULL;
        loom_result_t r = loom_comm_init_env(&comm, NULL);
        double took = now_ms() - t0;
        const char *root = getenv("LOOM_ROOT");
        const char *msg = loom_get_last_error();
        printf("%s after %.0f ms: %s\n", loom_strerror(r), took, msg);
        if (r != want || took > limit) return 1;
        /* The message names the address tried (host:port of LOOM_ROOT). */
        if (want == LOOM_ERR_CONNECT && root && !strstr(msg, root)) return 1;
        for (int i = 4; i < argc; i++)
            if (!strstr(msg, argv[i])) {
                printf("the message does not say '%s'\n", argv[i]);
                return 1;
            }
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "uid")) {
        /* Fork the ranks first and pass the id through a pipe, as a job
         * passes it out of band: forking after loom_get_unique_id would
         * copy its rendezvous thread's locks into the children. */
        int n = atoi(argv[2]);
        int fds[2];
        if (n < 1 || pipe(fds) != 0) return 2;
        for (int i = 0; i < n; i++) {
            if (fork() == 0) {
                close(fds[1]);
                loom_unique_id_t id;
                size_t got = 0;
                while (got < sizeof id) {
                    ssize_t k = read(fds[0], (char *)&id + got, sizeof id - got);
                    if (k <= 0) _exit(3);
                    got += (size_t)k;
                }
                loom_comm_t comm;
                loom_result_t r = loom_comm_init_rank(&comm, n, &id, i, NULL);
                if (r != LOOM_SUCCESS) {
                    fprintf(stderr, "rank %d: init_rank: %s\n", i, loom_get_last_error());
                    _exit(1);
                }
                int bad = check_allreduce(comm);
                loom_comm_destroy(comm);
                _exit(bad);
            }
        }
        close(fds[0]);
        loom_unique_id_t id;
        if (loom_get_unique_id(&id) != LOOM_SUCCESS) {
            fprintf(stderr, "get_unique_id: %s\n", loom_get_last_error());
            return 1;
        }
        for (int i = 0; i < n; i++)
            if (write(fds[1], &id, sizeof id) != (ssize_t)sizeof id) return 1;
        close(fds[1]);
        int bad = 0, st;
        while (wait(&st) > 0) {
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "a rank %s %d\n", WIFEXITED(st) ? "exited with" : "died of signal",
                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                bad = 1;
            }
        }
        return bad;
    }
    fprintf(stderr, "usage: mp_boot env | expect CODE MS [WORD...] | uid N\n");
    return 2;
}
