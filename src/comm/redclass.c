/*
 * redclass.c - how much slower than fp32 sums each datatype and op
 * reduces on this host, timed at init; the allreduce's slots (small.c)
 * and its tables (select.c, tune.c) take it into account.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/collectives.h"
#include "comm/comm.h"
#include "core/internal.h"
#include "reduce/reduce.h"
#include "topo/select.h"

/*
 * The datatype and the op matter to the allreduce: through the slots
 * every rank reduces the whole vector of every peer, (p-1)n, where the
 * engine's algorithms reduce (p-1)n/p, so a reduction slower than the
 * fp32 sum that the sweep times moves the crossover down: on 4 ranks at
 * 16K, bf16 sums, fp32 max and bf16 max were far slower through the
 * slots than by halving-doubling, int32 max about as fast, much as their
 * kernels ranked against fp32 sums in cache (perf/NOTES.md, "redclass.c,
 * classes").  So rank 0 times every kernel and puts each pair in a class
 * by that ratio, above each of CLASS_FROM; each class but the first gets
 * its own slot limit, swept with its slowest pair (which errs towards
 * the engine for the others in it), and its own allreduce table: the
 * model's, with reductions dearer by that pair's excess, and the spans
 * that the timing at init gives it.  (The model's table for fp32 sums
 * ran recursive doubling for bf16 max at 8K on 4 ranks, which reduces
 * twice the vector and was slower there than halving-doubling.)
 */
static const double CLASS_FROM[LOOMI_RED_CLASSES] = {0, 1.25, 2, 4};
#define KERNEL_BYTES ((size_t)32 << 10)
#define KERNEL_RUNS 5
#define KERNEL_PASSES 2

/* An element of value v in dt, written at p. */
static void put_value(unsigned char *p, loom_datatype_t dt, int v)
{
    switch (dt) {
    case LOOM_INT8:
    case LOOM_UINT8: *p = (unsigned char)v; break;
    case LOOM_INT32:
    case LOOM_UINT32: {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, sizeof x);
        break;
    }
    case LOOM_INT64:
    case LOOM_UINT64: {
        uint64_t x = (uint64_t)v;
        memcpy(p, &x, sizeof x);
        break;
    }
    case LOOM_FLOAT16:
    case LOOM_BFLOAT16: {
        uint16_t x = dt == LOOM_FLOAT16 ? loomi_fp32_to_fp16((float)v) : loomi_fp32_to_bf16((float)v);
        memcpy(p, &x, sizeof x);
        break;
    }
    case LOOM_FLOAT32: {
        float x = (float)v;
        memcpy(p, &x, sizeof x);
        break;
    }
    default: {
        double x = (double)v;
        memcpy(p, &x, sizeof x);
        break;
    }
    }
}

/* Every pair as fp32 sums: class 0, no excess, no slowest pairs. */
static void no_classes(struct loomi_red_classes *rc)
{
    memset(rc, 0, sizeof *rc);
    memset(rc->rep, 0xff, sizeof rc->rep);
}

/* Rank 0: time every kernel in cache against fp32 sums (LOOM_AVG reduces
 * as LOOM_SUM).  Operands 2 and 1, so that no run meets subnormals,
 * infinities or NaNs. */
static loom_result_t measure_kernels(struct loomi_red_classes *rc)
{
    unsigned char *d = malloc(KERNEL_BYTES), *src = malloc(KERNEL_BYTES),
                  *twos = malloc(KERNEL_BYTES);
    if (!d || !src || !twos) {
        free(d);
        free(src);
        free(twos);
        return loomi_fail(LOOM_ERR_NO_MEMORY, 0, "timing the reductions: out of memory");
    }
    /* Two passes over all of them, each pair's best run counting: a
     * host's other tenants, slowing one pass, the fp32 sums' above all,
     * moved pairs across classes from job to job (bf16 sums into class 1
     * in one of six 4-rank jobs here). */
    double t[LOOM_NUM_DATATYPES][LOOM_NUM_OPS];
    for (int dt = 0; dt < LOOM_NUM_DATATYPES; dt++)
        for (int op = 0; op < LOOM_NUM_OPS; op++) t[dt][op] = 1e30;
    for (int pass = 0; pass < KERNEL_PASSES; pass++)
    for (int dt = 0; dt < LOOM_NUM_DATATYPES; dt++) {
        const size_t es = loom_datatype_size((loom_datatype_t)dt), count = KERNEL_BYTES / es;
        for (size_t i = 0; i < count; i++) {
            put_value(src + i * es, (loom_datatype_t)dt, 1);
            put_value(twos + i * es, (loom_datatype_t)dt, 2);
        }
        for (int op = 0; op < LOOM_NUM_OPS; op++) {
            if (op == LOOM_AVG) continue;
            uint64_t best = UINT64_MAX;
            for (int run = 0; run <= KERNEL_RUNS; run++) {
                memcpy(d, twos, KERNEL_BYTES);
                const uint64_t t0 = loomi_now_ns();
                loomi_reduce_inplace(d, src, count, (loom_datatype_t)dt, (loom_op_t)op);
                const uint64_t ns = loomi_now_ns() - t0;
                if (run && ns < best) best = ns ? ns : 1; /* run 0 warms up */
            }
            if ((double)best < t[dt][op]) t[dt][op] = (double)best;
        }
        t[dt][LOOM_AVG] = t[dt][LOOM_SUM];
    }
    free(twos);
    free(d);
    free(src);
    const double base = t[LOOM_FLOAT32][LOOM_SUM];
    double worst[LOOMI_RED_CLASSES] = {0};
    no_classes(rc);
    for (int dt = 0; dt < LOOM_NUM_DATATYPES; dt++)
        for (int op = 0; op < LOOM_NUM_OPS; op++) {
            const double ratio = t[dt][op] / base;
            int k = 0;
            while (k + 1 < LOOMI_RED_CLASSES && ratio > CLASS_FROM[k + 1]) k++;
            if (dt == LOOM_FLOAT32 && op == LOOM_SUM) k = 0; /* the sweep's own */
            rc->cls[dt][op] = (uint8_t)k;
            if (k && ratio > worst[k]) {
                worst[k] = ratio;
                rc->excess[k] = (t[dt][op] - base) / (double)KERNEL_BYTES;
                rc->rep[k][0] = (uint8_t)dt;
                rc->rep[k][1] = (uint8_t)op;
            }
        }
    return LOOM_SUCCESS;
}

void loomi_red_class_describe(const struct loom_comm *c, int k, char *buf, size_t len)
{
    size_t u = 0;
    int full = 0;
    buf[0] = 0;
    for (int dt = 0; dt < LOOM_NUM_DATATYPES && !full; dt++)
        for (int op = 0, first = 1; op < LOOM_NUM_OPS && !full; op++) {
            if (c->red.cls[dt][op] != k) continue;
            int w = first ? snprintf(buf + u, len - u, "%s%s %s", u ? "; " : "",
                                     loomi_dtype_name((loom_datatype_t)dt),
                                     loomi_op_name((loom_op_t)op))
                          : snprintf(buf + u, len - u, ",%s", loomi_op_name((loom_op_t)op));
            first = 0;
            if (w < 0 || u + (size_t)w >= len) full = 1;
            else u += (size_t)w;
        }
    if (full && len > 4) memcpy(buf + (u + 4 <= len ? u : len - 4), "...", 4);
    if (!u && !full) snprintf(buf, len, "none");
}

int loomi_red_class(const struct loom_comm *comm, loom_datatype_t dtype, loom_op_t op)
{
    if ((unsigned)dtype >= LOOM_NUM_DATATYPES || (unsigned)op >= LOOM_NUM_OPS) return 0;
    return comm->red.cls[dtype][op];
}

loom_result_t loomi_red_classes_measure(struct loom_comm *c)
{
    no_classes(&c->red);
    struct loomi_links *l = c->links;
    struct loomi_red_classes rc;
    no_classes(&rc);
    const uint64_t t0 = loomi_now_ns();
    const int inherited = l && l->red_known;
    if (inherited) {
        /* Every rank of a communicator made from another has that one's
         * links, and with them its classes (joiners get both over the
         * network, checked): the same CPUs, so nobody times them again. */
        rc = l->red;
    } else {
        if (!c->set.probe || c->nranks < 2) return LOOM_SUCCESS;
        /* Rank 0 sends something whatever happens, so that the others
         * never wait for it in vain: without its buffers, no classes
         * (everything as fp32 sums). */
        if (c->rank == 0 && measure_kernels(&rc) != LOOM_SUCCESS) {
            LOOMI_INFO(c->rank, "reductions not timed (%s): every one as fp32 sums",
                       loom_get_last_error());
            no_classes(&rc);
        }
        loom_result_t r = loomi_call_broadcast("loom_broadcast", &rc, &rc, sizeof rc, LOOM_UINT8, 0,
                                               c->handle, NULL);
        if (r == LOOM_SUCCESS && !loomi_red_classes_valid(&rc))
            r = loomi_fail(LOOM_ERR_MISMATCH, c->rank,
                           "rank 0 sent out-of-range classes of reductions");
        if (r != LOOM_SUCCESS)
            return loomi_fail(r, c->rank, "timing the reductions: %s", loom_get_last_error());
        if (l) {
            l->red = rc;
            l->red_known = 1;
        }
    }
    c->red = rc;
    if (c->rank == 0) {
        char names[512];
        for (int q = 1; q < LOOMI_RED_CLASSES; q++) {
            loomi_red_class_describe(c, q, names, sizeof names);
            LOOMI_INFO(c->rank,
                       "reductions of class %d, over %.3g times as long as fp32 sums' in cache "
                       "(slowest %s %s, %.4f ns/B more; %s): %s",
                       q, CLASS_FROM[q],
                       rc.rep[q][0] == 0xff ? "-" : loomi_dtype_name((loom_datatype_t)rc.rep[q][0]),
                       rc.rep[q][0] == 0xff ? "-" : loomi_op_name((loom_op_t)rc.rep[q][1]),
                       rc.excess[q],
                       inherited ? "the parent communicator's, not timed again" : "timed",
                       names);
        }
        if (!inherited)
            LOOMI_INFO(c->rank, "reductions timed in %.1f ms",
                       (double)(loomi_now_ns() - t0) * 1e-6);
    }
    return LOOM_SUCCESS;
}
