/*
 * gather_perf - gather benchmark in the nccl-tests format.
 *
 * As in nccl-tests, the size of a row is the root's whole receive buffer
 * (nranks blocks); the count column is the per-rank send count.
 */
#include "perf_common.h"

/* The root receives the (n-1)/n of the buffer it does not hold. */
static double busbw_factor(int nranks)
{
    return (double)(nranks - 1) / nranks;
}

static void sizes(size_t bytes, size_t type_size, int nranks, int rank,
                  perf_sizes_t *s)
{
    size_t per = bytes / type_size / (size_t)nranks;

    s->count = s->elems = s->send_elems = per;
    s->recv_elems = per * (size_t)nranks;
    s->bytes = s->recv_elems * type_size;
    /* In place (loom.h, NCCL): on the root, sendbuf == recvbuf + root *
     * sendcount; the other ranks use the same layout, as nccl-tests does,
     * and their receive buffer is not read. */
    s->ip_send_off = (size_t)rank * per;
    s->ip_recv_off = 0;
}

/* On the root, block r is rank r's send buffer; elsewhere undefined. */
static int expected(const perf_check_t *c, int rank, size_t j, double *value)
{
    size_t per = perf_check_sizes(c)->count;

    if (rank != perf_check_root(c))
        return 0;
    *value = perf_input(c, (int)(j / per), j % per);
    return 1;
}

static const perf_coll_desc_t gather = {
    .id = PERF_GATHER,
    .name = "gather",
    .reduces = 0,
    .rooted = 1,
    .peered = 0,
    .busbw_factor = busbw_factor,
    .sizes = sizes,
    .expected = expected,
};

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_backend, &gather);
}
