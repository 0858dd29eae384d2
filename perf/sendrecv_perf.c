/*
 * sendrecv_perf - point-to-point benchmark in the nccl-tests format: in
 * one group, every rank sends its buffer to rank + 1 and receives rank
 * - 1's, so that each link of the ring carries one message each way.
 */
#include "perf_common.h"

/* Each rank sends and receives the whole buffer once. */
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
    /* In place, as nccl-tests: one buffer is sent and received into. */
    s->ip_send_off = s->ip_recv_off = 0;
}

/* The buffer of the rank before. */
static int expected(const perf_check_t *c, int rank, size_t j, double *value)
{
    int n = perf_check_nranks(c);

    *value = perf_input(c, (rank + n - 1) % n, j);
    return 1;
}

static const perf_coll_desc_t sendrecv = {
    .id = PERF_SENDRECV,
    .name = "sendrecv",
    .reduces = 0,
    .rooted = 0,
    .peered = 1,
    .busbw_factor = busbw_factor,
    .sizes = sizes,
    .expected = expected,
};

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_backend, &sendrecv);
}
