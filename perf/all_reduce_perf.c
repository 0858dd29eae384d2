/*
 * all_reduce_perf - allreduce benchmark in the nccl-tests format.
 *
 * Only what is particular to allreduce lives here; the harness is
 * perf_common.c and the backend is whichever defines perf_backend
 * (backend_loom.c normally, peers/backend_mpi.c for Open MPI).
 */
#include "perf_common.h"

/* Each rank sends and receives 2(n-1)/n of the data in a ring. */
static double busbw_factor(int nranks)
{
    return 2.0 * (nranks - 1) / nranks;
}

static void sizes(size_t bytes, size_t type_size, int nranks, int rank,
                  perf_sizes_t *s)
{
    (void)nranks;
    (void)rank;
    s->count = bytes / type_size;
    s->send_elems = s->recv_elems = s->elems = s->count;
    s->bytes = s->count * type_size;
    s->ip_send_off = s->ip_recv_off = 0;
}

static int expected(const perf_check_t *c, int rank, size_t j, double *value)
{
    (void)rank;
    *value = perf_reduced(c, j);
    return 1;
}

static const perf_coll_desc_t all_reduce = {
    .id = PERF_ALLREDUCE,
    .name = "all_reduce",
    .reduces = 1,
    .rooted = 0,
    .peered = 0,
    .busbw_factor = busbw_factor,
    .sizes = sizes,
    .expected = expected,
};

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_backend, &all_reduce);
}
