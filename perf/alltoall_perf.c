/*
 * alltoall_perf - all-to-all benchmark in the nccl-tests format.
 *
 * As in nccl-tests, the size of a row is a whole buffer (nranks blocks,
 * one per peer); the count column is the block count, the count argument
 * of loom_alltoall.
 */
#include "perf_common.h"

/* Each rank keeps 1/n of its buffer and exchanges the rest. */
static double busbw_factor(int nranks)
{
    return (double)(nranks - 1) / nranks;
}

static void sizes(size_t bytes, size_t type_size, int nranks, int rank,
                  perf_sizes_t *s)
{
    size_t per = bytes / type_size / (size_t)nranks;

    (void)rank;
    s->count = s->elems = per;
    s->send_elems = s->recv_elems = per * (size_t)nranks;
    s->bytes = s->send_elems * type_size;
    s->ip_send_off = s->ip_recv_off = 0; /* in place: sendbuf == recvbuf */
}

/* Block r of the result is block `rank` of rank r's send buffer. */
static int expected(const perf_check_t *c, int rank, size_t j, double *value)
{
    size_t per = perf_check_sizes(c)->count;

    *value = perf_input(c, (int)(j / per), (size_t)rank * per + j % per);
    return 1;
}

static const perf_coll_desc_t alltoall = {
    .id = PERF_ALLTOALL,
    .name = "alltoall",
    .reduces = 0,
    .rooted = 0,
    .peered = 0,
    .busbw_factor = busbw_factor,
    .sizes = sizes,
    .expected = expected,
};

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_backend, &alltoall);
}
