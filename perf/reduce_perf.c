/*
 * reduce_perf - reduce benchmark in the nccl-tests format.
 */
#include "perf_common.h"

/* A pipelined reduce moves the whole buffer over each link once. */
static double busbw_factor(int nranks)
{
    (void)nranks;
    return 1.0;
}

static void sizes(size_t bytes, size_t type_size, int nranks, int rank,
                  perf_sizes_t *s)
{
    (void)nranks;
    (void)rank;
    s->count = s->elems = s->send_elems = s->recv_elems = bytes / type_size;
    s->bytes = s->count * type_size;
    s->ip_send_off = s->ip_recv_off = 0; /* in place: sendbuf == recvbuf */
}

/* Only the root's receive buffer is defined. */
static int expected(const perf_check_t *c, int rank, size_t j, double *value)
{
    if (rank != perf_check_root(c))
        return 0;
    *value = perf_reduced(c, j);
    return 1;
}

static const perf_coll_desc_t reduce = {
    .id = PERF_REDUCE,
    .name = "reduce",
    .reduces = 1,
    .rooted = 1,
    .peered = 0,
    .busbw_factor = busbw_factor,
    .sizes = sizes,
    .expected = expected,
};

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_backend, &reduce);
}
