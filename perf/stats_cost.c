/*
 * stats_cost.c - what the straggler telemetry (src/sched/stats.c) costs
 * an operation, measured on its own: the calls the engine makes for one
 * operation of a 4-rank job, run in a loop on synthetic operations.
 *
 *   msg:  a message schedule that receives from P peers (1 and 2), one each,
 *         all posted at the start (loomi_stats_op_begin, P x
 *         loomi_stats_recv, loomi_stats_op_done): P + 1 clock readings
 *   slot: a small collective on one host whose peers were all there
 *         (loomi_stats_slot_prompt): no clock reading
 *
 * usage: stats_cost [ITERS]   prints ns per operation for each, and the
 *                             clock's cost for comparison (the median of
 *                             5 runs of ITERS each)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "core/hostmap.h"
#include "sched/op.h"
#include "sched/sched.h"

static double per_op(uint64_t t0, uint64_t t1, long n) { return (double)(t1 - t0) / (double)n; }

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 1000000;
    enum { N = 4, R = 5 };
    static struct loomi_engine e;
    static int rank = 0;
    static int host_of[N], local_index[N] = {0, 1, 2, 3}, host_start[2] = {0, N},
               host_ranks[N] = {0, 1, 2, 3};
    static struct loomi_hostmap hm = {N, 1, host_of, local_index, host_start, host_ranks};
    struct loomi_hostmap *hmp = &hm;
    e.rank = &rank;
    e.hosts = &hmp;
    if (iters < 1 || loomi_stats_init(&e, N) != 0) return 1;
    struct loomi_op *op = calloc(1, sizeof *op);
    struct loomi_step steps[2];
    struct loomi_xfer xfers[2];
    memset(steps, 0, sizeof steps);
    memset(xfers, 0, sizeof xfers);
    for (int i = 0; i < 2; i++) {
        steps[i].kind = LOOMI_STEP_RECV;
        steps[i].peer = 1 + i;
        xfers[i].len = 8;
    }
    op->eng = &e;
    op->s.steps = steps;
    op->xfers = xfers;
    double t[4][R];
    volatile uint64_t sink = 0;
    for (int r = 0; r < R; r++) {
        uint64_t c0 = loomi_now_ns();
        for (long k = 0; k < iters; k++) sink += loomi_now_ns();
        uint64_t c1 = loomi_now_ns();
        t[0][r] = per_op(c0, c1, iters);
        for (int P = 1; P <= 2; P++) {
            c0 = loomi_now_ns();
            for (long k = 0; k < iters; k++) {
                loomi_stats_op_begin(op);
                for (int i = 0; i < P; i++) {
                    xfers[i].post_ns = op->t0_ns; /* posted at the start */
                    loomi_stats_recv(op, (uint32_t)i);
                }
                loomi_stats_op_done(op);
            }
            c1 = loomi_now_ns();
            t[P][r] = per_op(c0, c1, iters);
        }
        c0 = loomi_now_ns();
        for (long k = 0; k < iters; k++) loomi_stats_slot_prompt(&e, N, 8);
        c1 = loomi_now_ns();
        t[3][r] = per_op(c0, c1, iters);
    }
    for (int j = 0; j < 4; j++) qsort(t[j], R, sizeof t[j][0], cmp_double);
    printf("clock reading: %.1f ns\n", t[0][R / 2]);
    printf("msg, 1 peer: %.1f ns per operation\n", t[1][R / 2]);
    printf("msg, 2 peers: %.1f ns per operation\n", t[2][R / 2]);
    printf("slot, %d ranks: %.1f ns per operation\n", N, t[3][R / 2]);
    loomi_stats_free(&e);
    free(op);
    return (int)(sink & 0);
}
