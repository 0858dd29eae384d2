/*
 * mp_errors.c - a failing job, as a user's program reports it.
 *
 *   mp_errors VICTIM
 *
 * Rank VICTIM SIGKILLs itself once the communicator is up; every other
 * rank runs an allreduce, which must fail, and prints the error the way
 * the README's example does: "rank R: <loom_strerror>: <last error>",
 * then exits 1.  test_errors.sh counts what each rank printed.
 */
#include <loom.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: mp_errors VICTIM\n");
        return 2;
    }
    int victim = atoi(argv[1]);
    loom_comm_t comm;
    loom_result_t r = loom_comm_init_env(&comm, NULL);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "init: %s: %s\n", loom_strerror(r), loom_get_last_error());
        return 1;
    }
    int rank;
    loom_comm_rank(comm, &rank);
    if (rank == victim)
        raise(SIGKILL);
    float grad[1024];
    for (int i = 0; i < 1024; i++) grad[i] = (float)rank;
    r = loom_allreduce(grad, grad, 1024, LOOM_FLOAT32, LOOM_AVG, comm);
    if (r != LOOM_SUCCESS)
        fprintf(stderr, "rank %d: %s: %s\n", rank, loom_strerror(r), loom_get_last_error());
    else
        printf("rank %d: the allreduce succeeded without rank %d\n", rank, victim);
    loom_comm_destroy(comm);
    return r != LOOM_SUCCESS;
}
