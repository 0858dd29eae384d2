/*
 * scatter_perf - scatter benchmark in the nccl-tests format.
 *
 * As in nccl-tests, the size of a row is the root's whole send buffer
 * (nranks blocks); the count column is the per-rank receive count.
 */
#include "perf_common.h"

/* The root sends the (n-1)/n of the buffer it keeps no copy of. */
static double busbw_factor(int nranks)
{
    return (double)(nranks - 1) / nranks;
}

static void sizes(size_t bytes, size_t type_size, int nranks, int rank,
                  perf_sizes_t *s)
{
    size_t per = bytes / type_size / (size_t)nranks;

    s->count = s->elems = s->recv_elems = per;
    s->send_elems = per * (size_t)nranks;
    s->bytes = s->send_elems * type_size;
    /* In place (loom.h, NCCL): on the root, recvbuf == sendbuf + root *
     * recvcount; the other ranks use the same layout, as nccl-tests does,
     * and their send buffer is not read. */
    s->ip_send_off = 0;
    s->ip_recv_off = (size_t)rank * per;
}

/* Rank r receives block r of the root's send buffer. */
static int expected(const perf_check_t *c, int rank, size_t j, double *value)
{
    *value = perf_input(c, perf_check_root(c),
                        (size_t)rank * perf_check_sizes(c)->count + j);
    return 1;
}

static const perf_coll_desc_t scatter = {
    .id = PERF_SCATTER,
    .name = "scatter",
    .reduces = 0,
    .rooted = 1,
    .peered = 0,
    .busbw_factor = busbw_factor,
    .sizes = sizes,
    .expected = expected,
};

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_backend, &scatter);
}
