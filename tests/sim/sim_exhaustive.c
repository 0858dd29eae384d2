/*
 * sim_exhaustive.c - every collective x algorithm x rank count x count x
 * datatype (x op, x root, in place or not), all ranks in this process
 * over the sim transport.
 *
 * For each case: build every rank's schedule and validate them together
 * (matching, deadlock, ranges, hazards), then run the case through the
 * public API on sim communicators with the algorithm forced, drive all
 * ranks with loom_test, and compare every byte of every buffer with a
 * plain reference: outputs equal the reference (floats within the
 * rounding bound of a sum in any order), inputs of out-of-place calls
 * and everything outside the output extent (gaps, guard zones) untouched,
 * and allreduce/allgather/broadcast results bit-identical on all ranks.
 *
 * Inputs are chosen so that most reductions are exact in every type
 * (multiples of 1/4 in [-4, 4]; integers in [-4, 4] for bf16), so the
 * tolerance only has to absorb what the type really rounds.
 *
 * Hierarchical algorithms need to know which ranks share a host: they run
 * after the others on each world, over host layouts (layouts_for: one
 * host, a host per rank, uniform H x L blocks, interleaved and uneven
 * hosts), with the map set on the sim communicators and in the args of
 * the validated schedules.  The shared-arena algorithm is left out here:
 * the lead's shared-arena tests cover it.
 *
 * usage: sim_exhaustive [-q] [-v] [-H] [-X] [-c coll] [-a algo] [-n nranks]
 *                       [-t dtype] [-o op] [-k count] [-i 0|1] [-r root]
 *                       [-L layout] [-s seed] [-m maxshown]
 *   -q  quick (also LOOM_TEST_QUICK=1): fewer rank counts and cases
 *   -H  skip the hazard check of the validator (LOOM_SIM_HAZARDS=0 too)
 *   -X  self-check: corrupt one output byte of the first case with output
 *       (the run must then report exactly that failure)
 *   -L  only that host layout (hierarchical cases: none, one, each, HxL,
 *       alt2, alt3, 3+1, 5+1+2)
 *   filters restrict the suite to matching cases (to replay a failure;
 *   every failure prints its own filter line and seed).
 * Exit status: 0 when nothing failed, 1 otherwise.
 */
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "core/internal.h"
#include "loom.h"
#include "reduce/reduce.h"
#include "coll/validate.h"
#include "comm/local.h"
#include "tests/elem.h"
#include "tests/sim/harness.h"

#define GUARD 64  /* bytes checked on each side of every buffer */
#define MAXP 64
#define MSG 2048

static const char *const dtype_names[LOOM_NUM_DATATYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
    "bfloat16"};
static const char *const op_names[LOOM_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

/* ------------------------------------------------------------ options */

static struct {
    int quick, verbose, hazards, maxshown, corrupt;
    int coll, algo, nranks, dtype, op, inplace, root;
    long long count;
    uint64_t seed;
    const char *layout;
} opt = {0, 0, 1, 8, 0, -1, -1, -1, -1, -1, -1, -1, -1, 0x10037, NULL};

static struct {
    uint64_t validated, cases, equal, failures, hazard_pairs,
        hazard_truncated, messages, digest;
} cnt;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* ------------------------------------------------------------- a case */

/* Which ranks share a host, for the hierarchical algorithms. */
struct layout {
    char name[24];
    int host_of[MAXP];
    struct loomi_hostmap *map;
};

struct ccase {
    int coll, algo, p, root, inplace;
    loom_datatype_t dtype;
    loom_op_t op;
    size_t count, chunk;
    uint64_t seed;
    const struct layout *lay; /* NULL: no host map */
    /* Gossip: 0 the seeded pairing of `round` (the validator checks the
     * generator's own under seed `seed`), 1 explicit r <-> p-1-r, 2
     * explicit 2i <-> 2i+1 (an odd rank out sits idle, as the middle
     * one of 1). */
    int gmode;
    uint64_t round;
};

static int reduces(int coll)
{
    return coll == LOOMI_COLL_ALLREDUCE || coll == LOOMI_COLL_REDUCE_SCATTER ||
           coll == LOOMI_COLL_REDUCE;
}
static int rooted(int coll)
{
    return coll == LOOMI_COLL_BROADCAST || coll == LOOMI_COLL_REDUCE ||
           coll == LOOMI_COLL_GATHER || coll == LOOMI_COLL_SCATTER;
}

static void case_str(const struct ccase *c, char *b, size_t n)
{
    if (c->coll == LOOMI_COLL_GOSSIP) {
        snprintf(b, n, "%s/%s p=%d count=%zu %s %s round=%llu chunk=%zu", loomi_coll_name(c->coll),
                 loomi_algo_name(c->algo), c->p, c->count, dtype_names[c->dtype],
                 c->gmode == 0 ? "seeded" : c->gmode == 1 ? "explicit-reversed" : "explicit-adjacent",
                 (unsigned long long)c->round, c->chunk);
        return;
    }
    snprintf(b, n, "%s/%s p=%d count=%zu %s%s%s%s root=%d chunk=%zu%s%s", loomi_coll_name(c->coll),
             loomi_algo_name(c->algo), c->p, c->count, dtype_names[c->dtype],
             reduces(c->coll) ? "/" : "", reduces(c->coll) ? op_names[c->op] : "",
             c->inplace ? " in-place" : "", c->root, c->chunk, c->lay ? " hosts=" : "",
             c->lay ? c->lay->name : "");
}

static void fail_case(const struct ccase *c, const char *fmt, ...) LOOMI_PRINTF(2, 3);
static void fail_case(const struct ccase *c, const char *fmt, ...)
{
    cnt.failures++;
    if (cnt.failures > (uint64_t)opt.maxshown && !opt.verbose) return;
    char d[256], m[MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    case_str(c, d, sizeof d);
    printf("FAIL %s: %s\n     replay: -c %s -a %s -n %d -t %s -o %s -k %zu -i %d -r %d%s%s -s %#" PRIx64
           "\n",
           d, m, loomi_coll_name(c->coll), loomi_algo_name(c->algo), c->p,
           dtype_names[c->dtype], op_names[c->op], c->count, c->inplace, c->root,
           c->lay ? " -L " : "", c->lay ? c->lay->name : "", opt.seed);
    fflush(stdout);
}

/* ------------------------------------------------------------- values */

static int is_unsigned(loom_datatype_t t)
{
    return t == LOOM_UINT8 || t == LOOM_UINT32 || t == LOOM_UINT64;
}
static int is_float(loom_datatype_t t)
{
    return t == LOOM_FLOAT16 || t == LOOM_FLOAT32 || t == LOOM_FLOAT64 || t == LOOM_BFLOAT16;
}

/* Input element i of rank q for a reduction. */
static double rval(loom_datatype_t t, loom_op_t op, int q, size_t i)
{
    size_t h = (size_t)q * 7 + i * 3 + (size_t)op;
    if (op == LOOM_PROD) {
        int v = (q + i) % 5 == 0 ? 2 : ((q + i) % 7 == 0 ? -1 : 1);
        return is_unsigned(t) && v < 0 ? 3 : v;
    }
    if (is_unsigned(t)) return (double)(h % 9);
    if (t == LOOM_FLOAT16 || t == LOOM_FLOAT32 || t == LOOM_FLOAT64)
        return ((double)(h % 33) - 16) / 4;
    return (double)(h % 9) - 4; /* signed integers, bf16 */
}

/* Unit roundoff of each float type. */
static double unit_roundoff(loom_datatype_t t)
{
    switch (t) {
    case LOOM_FLOAT16: return ldexp(1, -11);
    case LOOM_BFLOAT16: return ldexp(1, -8);
    case LOOM_FLOAT32: return ldexp(1, -24);
    default: return ldexp(1, -53);
    }
}

/* The reduction over p ranks of element i, stored in type t at out, and
 * the error a float result may carry (0 for integers: they are exact,
 * wrapping as the type does). */
static double ref_elem(loom_datatype_t t, loom_op_t op, int p, size_t i, void *out)
{
    size_t es = loom_datatype_size(t);
    if (!is_float(t)) {
        int64_t sum = 0, mx = 0, mn = 0;
        uint64_t prod = 1;
        for (int q = 0; q < p; q++) {
            int64_t v = (int64_t)rval(t, op, q, i);
            sum += v;
            prod *= (uint64_t)v;
            if (!q || v > mx) mx = v;
            if (!q || v < mn) mn = v;
        }
        uint64_t bits = op == LOOM_PROD ? prod
                        : op == LOOM_MAX ? (uint64_t)mx
                        : op == LOOM_MIN ? (uint64_t)mn
                                         : (uint64_t)sum;
        memcpy(out, &bits, es); /* the low bytes: wraps as the type (little endian) */
        if (op == LOOM_AVG && p > 1) {
            switch (t) {
            case LOOM_INT8: *(int8_t *)out = (int8_t)(*(int8_t *)out / p); break;
            case LOOM_UINT8: *(uint8_t *)out = (uint8_t)(*(uint8_t *)out / p); break;
            case LOOM_INT32: *(int32_t *)out = *(int32_t *)out / p; break;
            case LOOM_UINT32: *(uint32_t *)out = *(uint32_t *)out / (uint32_t)p; break;
            case LOOM_INT64: *(int64_t *)out = *(int64_t *)out / p; break;
            case LOOM_UINT64: *(uint64_t *)out = *(uint64_t *)out / (uint64_t)p; break;
            default: break;
            }
        }
        return 0;
    }
    double sum = 0, abs = 0, prod = 1, mx = 0, mn = 0;
    for (int q = 0; q < p; q++) {
        double v = rval(t, op, q, i);
        sum += v;
        abs += fabs(v);
        prod *= v;
        if (!q || v > mx) mx = v;
        if (!q || v < mn) mn = v;
    }
    double u = unit_roundoff(t), r, tol = 0;
    switch (op) {
    case LOOM_PROD: r = prod; break; /* powers of two: exact */
    case LOOM_MAX: r = mx; break;
    case LOOM_MIN: r = mn; break;
    case LOOM_AVG:
        /* The sum (any order), then one division (in fp32 below fp64). */
        r = t == LOOM_FLOAT64 ? sum / p : (double)((float)sum / (float)p);
        tol = ((p - 1) * u * abs) / p + 2 * u * fabs(r);
        break;
    default: r = sum; tol = (p - 1) * u * abs;
    }
    put(out, 0, t, r);
    return tol;
}

/* ------------------------------------------------------------ buffers */

/* One allocation with GUARD bytes on both sides.  `init` is its content
 * before the call, `want` what it must hold after; [tol_lo, tol_hi) (bytes
 * from the data start) holds float reduction results, compared within
 * tol[] per element. */
struct region {
    unsigned char *mem, *init, *want;
    size_t len;
    size_t tol_lo, tol_hi;
    double *tol;
};

static unsigned char *dat(struct region *g) { return g->mem + GUARD; }

static int region_alloc(struct region *g, size_t len, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    g->len = len;
    size_t all = len + 2 * GUARD;
    g->mem = malloc(all);
    g->init = malloc(all);
    g->want = malloc(all);
    if (!g->mem || !g->init || !g->want) return -1;
    /* Junk everywhere: the inputs of data-moving collectives, and what an
     * output not written would still show. */
    uint64_t x = seed | 1;
    for (size_t i = 0; i < all; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(g->mem + i, &x, all - i < 8 ? all - i : 8);
    }
    return 0;
}

static void region_snapshot(struct region *g)
{
    memcpy(g->init, g->mem, g->len + 2 * GUARD);
    memcpy(g->want, g->mem, g->len + 2 * GUARD);
}

static void region_free(struct region *g)
{
    free(g->mem);
    free(g->init);
    free(g->want);
    free(g->tol);
    memset(g, 0, sizeof *g);
}

struct rankbuf {
    struct region A, B; /* "send" and "recv" allocations (either may be unused) */
    const void *sendbuf;
    void *recvbuf;
    size_t sc[MAXP], sd[MAXP], rc[MAXP], rd[MAXP]; /* alltoallv */
    int gpeer; /* gossip: the partner (the rank itself: idle) */
};

/* alltoallv: elements rank r sends to rank q (uneven, some zero). */
static size_t v_count(size_t count, int r, int q)
{
    if (!count) return 0;
    if ((r * 5 + q * 3) % 4 == 1) return 0;
    return 1 + count * (size_t)((r * 3 + q) % 5) / 4;
}

/* Compare one region; returns 0 or fills why. */
static int region_check(struct region *g, loom_datatype_t t, const char *name, int rank,
                        char *why, size_t n)
{
    size_t es = loom_datatype_size(t), all = g->len + 2 * GUARD;
    size_t lo = g->tol ? GUARD + g->tol_lo : all, hi = g->tol ? GUARD + g->tol_hi : all;
    for (size_t i = 0; i < all; i++) {
        if (i == lo) {
            for (size_t k = 0; k < (g->tol_hi - g->tol_lo) / es; k++) {
                double got = get(g->mem + lo, k, t), want = get(g->want + lo, k, t);
                if (got == want || fabs(got - want) <= g->tol[k]) continue;
                snprintf(why, n, "rank %d %s element %zu: got %.9g, want %.9g (tolerance %.3g)",
                         rank, name, (g->tol_lo / es) + k, got, want, g->tol[k]);
                return -1;
            }
            i = hi - 1;
            continue;
        }
        if (g->mem[i] != g->want[i]) {
            const char *where = i < GUARD ? "the guard before it"
                                : i >= GUARD + g->len ? "the guard after it"
                                : memcmp(g->want + i, g->init + i, 1) == 0 ? "(should be untouched)"
                                                                          : "(output)";
            size_t off = i < GUARD ? GUARD - i : i - GUARD;
            snprintf(why, n,
                     "rank %d %s byte %s%zu %s: got 0x%02x, want 0x%02x (element %zu of %zu "
                     "bytes)",
                     rank, name, i < GUARD ? "-" : "", off, where, g->mem[i], g->want[i],
                     i >= GUARD ? (i - GUARD) / es : 0, g->len);
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------- the world */

struct world {
    int p;
    struct loomi_sim_world *w;
    loom_comm_t comms[MAXP];
};

static int world_open(struct world *W, int p)
{
    W->p = p;
    loom_config_t cfg = LOOM_CONFIG_INITIALIZER;
    cfg.timeout_ms = 600000; /* hangs are found by the driver, not the clock */
    if (loomi_sim_world_create(p, opt.seed, &cfg, &W->w, W->comms) != LOOM_SUCCESS) {
        printf("FAIL cannot create a sim world of %d ranks: %s\n", p, loom_get_last_error());
        cnt.failures++;
        return -1;
    }
    return 0;
}

static void world_close(struct world *W)
{
    struct loomi_sim_stats st;
    loomi_sim_world_stats(W->w, &st);
    cnt.digest = mix(cnt.digest ^ st.digest);
    loomi_sim_world_destroy(W->w, W->comms);
    W->w = NULL;
}

/* ------------------------------------------------------ one case, run */

/* Arguments each rank passes, as collectives.c derives them from the
 * pointers (for the schedules validated before the run). */
static void args_for(const struct ccase *c, int r, struct rankbuf *rb, struct loomi_coll_args *a)
{
    memset(a, 0, sizeof *a);
    a->coll = c->coll;
    a->count = c->count;
    a->root = c->root;
    a->chunk_bytes = c->chunk;
    a->hosts = c->lay ? c->lay->map : NULL;
    int is_root = r == c->root;
    switch (c->coll) {
    case LOOMI_COLL_BROADCAST:
    case LOOMI_COLL_REDUCE:
    case LOOMI_COLL_GATHER:
    case LOOMI_COLL_SCATTER: a->inplace = c->inplace && is_root; break;
    case LOOMI_COLL_ALLTOALLV:
        a->counts = rb->sc;
        a->displs = rb->sd;
        a->rcounts = rb->rc;
        a->rdispls = rb->rd;
        a->count = 0;
        for (int q = 0; q < c->p; q++) {
            if (rb->sc[q] && rb->sd[q] + rb->sc[q] > a->count) a->count = rb->sd[q] + rb->sc[q];
            if (rb->rc[q] && rb->rd[q] + rb->rc[q] > a->count) a->count = rb->rd[q] + rb->rc[q];
        }
        break;
    case LOOMI_COLL_BARRIER: break;
    case LOOMI_COLL_GOSSIP:
        a->inplace = 1;
        if (c->gmode == 0) {
            a->gossip_round = c->round;
            a->gossip_seed = c->seed;
        } else {
            a->gossip_peer1 = rb->gpeer + 1;
        }
        break;
    default: a->inplace = c->inplace;
    }
}

/* Gossip: rank r's partner in case c (the comm's seeded pairing). */
static int gossip_peer(const struct ccase *c, int r, loom_comm_t comm)
{
    int q = r;
    switch (c->gmode) {
    case 0:
        if (loom_gossip_partner(comm, c->round, &q) != LOOM_SUCCESS) q = -1;
        break;
    case 1: q = c->p - 1 - r; break;
    default: q = (r ^ 1) < c->p ? r ^ 1 : r;
    }
    return q;
}

/* Lay out rank r's buffers and inputs.  Returns -1 on allocation failure. */
static int setup_rank(const struct ccase *c, int r, struct rankbuf *rb)
{
    const int p = c->p;
    const size_t es = loom_datatype_size(c->dtype), n = c->count * es, pn = (size_t)p * n;
    const int is_root = r == c->root, ip = c->inplace;
    uint64_t sa = mix(c->seed ^ ((uint64_t)r << 20) ^ 0xa), sb = mix(c->seed ^ ((uint64_t)r << 20) ^ 0xb);
    size_t alen = 0, blen = 0;
    switch (c->coll) {
    case LOOMI_COLL_ALLREDUCE: alen = ip ? 0 : n; blen = n; break;
    case LOOMI_COLL_REDUCE_SCATTER: alen = pn; blen = ip ? 0 : n; break;
    case LOOMI_COLL_ALLGATHER: alen = ip ? 0 : n; blen = pn; break;
    case LOOMI_COLL_ALLTOALL: alen = ip ? 0 : pn; blen = pn; break;
    case LOOMI_COLL_ALLTOALLV: {
        /* Send blocks packed in reverse peer order with gaps; receive
         * blocks in order, a gap after every third. */
        size_t off = 0;
        for (int q = p - 1; q >= 0; q--) {
            rb->sc[q] = v_count(c->count, r, q);
            rb->sd[q] = off;
            off += rb->sc[q] + (size_t)(q % 2);
        }
        alen = off * es;
        off = 0;
        for (int q = 0; q < p; q++) {
            rb->rc[q] = v_count(c->count, q, r);
            rb->rd[q] = off;
            off += rb->rc[q] + (q % 3 == 2);
        }
        blen = off * es;
        break;
    }
    case LOOMI_COLL_BROADCAST: alen = ip ? 0 : n; blen = n; break;
    case LOOMI_COLL_REDUCE: alen = is_root && ip ? 0 : n; blen = is_root ? n : 0; break;
    case LOOMI_COLL_GATHER: alen = is_root && ip ? 0 : n; blen = is_root ? pn : 0; break;
    case LOOMI_COLL_SCATTER: alen = is_root ? pn : 0; blen = is_root && ip ? 0 : n; break;
    case LOOMI_COLL_GOSSIP: blen = n; break;
    default: break;
    }
    if (region_alloc(&rb->A, alen, sa) || region_alloc(&rb->B, blen, sb)) return -1;
    unsigned char *A = dat(&rb->A), *B = dat(&rb->B);
    /* Pointers, following loom.h's in-place rules. */
    switch (c->coll) {
    case LOOMI_COLL_ALLREDUCE:
    case LOOMI_COLL_ALLTOALL:
        rb->sendbuf = ip ? B : A;
        rb->recvbuf = B;
        break;
    case LOOMI_COLL_REDUCE_SCATTER:
        rb->sendbuf = A;
        rb->recvbuf = ip ? A + (size_t)r * n : B;
        break;
    case LOOMI_COLL_ALLGATHER:
        rb->sendbuf = ip ? B + (size_t)r * n : A;
        rb->recvbuf = B;
        break;
    case LOOMI_COLL_ALLTOALLV:
        rb->sendbuf = A;
        rb->recvbuf = B;
        break;
    case LOOMI_COLL_BROADCAST:
        rb->sendbuf = ip ? B : A;
        rb->recvbuf = B;
        break;
    case LOOMI_COLL_REDUCE:
        /* In place everyone passes one buffer; non-roots' recvbuf is
         * otherwise NULL (allowed: used on root only). */
        rb->sendbuf = is_root && ip ? B : A;
        rb->recvbuf = is_root ? B : (ip ? A : NULL);
        break;
    case LOOMI_COLL_GATHER:
        rb->sendbuf = is_root && ip ? B + (size_t)r * n : A;
        rb->recvbuf = is_root ? B : NULL;
        break;
    case LOOMI_COLL_SCATTER:
        rb->sendbuf = is_root ? A : NULL;
        rb->recvbuf = is_root && ip ? A + (size_t)r * n : B;
        break;
    case LOOMI_COLL_GOSSIP:
        rb->sendbuf = NULL;
        rb->recvbuf = B;
        for (size_t i = 0; i < c->count; i++) put(B, i, c->dtype, rval(c->dtype, LOOM_SUM, r, i));
        break;
    default: rb->sendbuf = rb->recvbuf = NULL;
    }
    /* Typed inputs of reductions (data movers use the junk as input). */
    if (reduces(c->coll)) {
        unsigned char *in = NULL;
        size_t nin = c->count;
        if (c->coll == LOOMI_COLL_REDUCE_SCATTER) {
            in = A;
            nin = (size_t)p * c->count;
        } else if (c->coll == LOOMI_COLL_ALLREDUCE) {
            in = ip ? B : A;
        } else {
            in = is_root && ip ? B : A;
        }
        for (size_t i = 0; i < nin; i++) put(in, i, c->dtype, rval(c->dtype, c->op, r, i));
    }
    region_snapshot(&rb->A);
    region_snapshot(&rb->B);
    return 0;
}

/* Where rank q's data-moving input lives in its snapshot. */
static const unsigned char *input_of(const struct ccase *c, struct rankbuf *rb, int q)
{
    size_t n = c->count * loom_datatype_size(c->dtype);
    struct rankbuf *x = &rb[q];
    int ip = c->inplace, is_root = q == c->root;
    switch (c->coll) {
    case LOOMI_COLL_ALLGATHER: return ip ? x->B.init + GUARD + (size_t)q * n : x->A.init + GUARD;
    case LOOMI_COLL_ALLTOALL: return ip ? x->B.init + GUARD : x->A.init + GUARD;
    case LOOMI_COLL_BROADCAST: return ip ? x->B.init + GUARD : x->A.init + GUARD;
    case LOOMI_COLL_GATHER:
        return is_root && ip ? x->B.init + GUARD + (size_t)q * n : x->A.init + GUARD;
    default: return x->A.init + GUARD; /* scatter (root), alltoallv */
    }
}

/* Fill in the reference outputs; returns -1 on allocation failure. */
static int expect_all(const struct ccase *c, struct rankbuf *rb)
{
    const int p = c->p;
    const loom_datatype_t t = c->dtype;
    const size_t es = loom_datatype_size(t), n = c->count * es;
    if (c->coll == LOOMI_COLL_GOSSIP) {
        /* (x_r + x_q) / 2 with its partner q; an idle rank keeps x_r. */
        for (int r = 0; r < p; r++) {
            const int q = rb[r].gpeer;
            struct region *g = &rb[r].B;
            if (q == r || !n) continue;
            g->tol = malloc(c->count * sizeof *g->tol);
            if (!g->tol) return -1;
            g->tol_lo = 0;
            g->tol_hi = n;
            const double u = unit_roundoff(t);
            for (size_t i = 0; i < c->count; i++) {
                double x = get(rb[r].B.init + GUARD, i, t), y = get(rb[q].B.init + GUARD, i, t);
                put(g->want + GUARD, i, t, (x + y) / 2);
                g->tol[i] = 2 * u * (fabs(x) + fabs(y));
            }
        }
        return 0;
    }
    if (reduces(c->coll)) {
        size_t nel = c->coll == LOOMI_COLL_REDUCE_SCATTER ? (size_t)p * c->count : c->count;
        unsigned char *ref = malloc(nel * es + 1);
        double *tol = malloc((nel + 1) * sizeof *tol);
        if (!ref || !tol) {
            free(ref);
            free(tol);
            return -1;
        }
        for (size_t i = 0; i < nel; i++) tol[i] = ref_elem(t, c->op, p, i, ref + i * es);
        for (int r = 0; r < p; r++) {
            struct region *g = NULL;
            size_t off = 0, from = 0;
            if (c->coll == LOOMI_COLL_ALLREDUCE) g = &rb[r].B;
            else if (c->coll == LOOMI_COLL_REDUCE) g = r == c->root ? &rb[r].B : NULL;
            else if (c->inplace) g = &rb[r].A, off = (size_t)r * n, from = (size_t)r * c->count;
            else g = &rb[r].B, from = (size_t)r * c->count;
            if (!g || !n) continue;
            memcpy(g->want + GUARD + off, ref + from * es, n);
            if (is_float(t)) {
                g->tol = malloc(c->count * sizeof *g->tol);
                if (!g->tol) {
                    free(ref);
                    free(tol);
                    return -1;
                }
                memcpy(g->tol, tol + from, c->count * sizeof *g->tol);
                g->tol_lo = off;
                g->tol_hi = off + n;
            }
        }
        free(ref);
        free(tol);
        return 0;
    }
    for (int r = 0; r < p; r++) {
        unsigned char *B = rb[r].B.want + GUARD;
        switch (c->coll) {
        case LOOMI_COLL_ALLGATHER:
            for (int q = 0; q < p; q++) memcpy(B + (size_t)q * n, input_of(c, rb, q), n);
            break;
        case LOOMI_COLL_ALLTOALL:
            for (int q = 0; q < p; q++)
                memcpy(B + (size_t)q * n, input_of(c, rb, q) + (size_t)r * n, n);
            break;
        case LOOMI_COLL_ALLTOALLV:
            for (int q = 0; q < p; q++)
                memcpy(B + rb[r].rd[q] * es, input_of(c, rb, q) + rb[q].sd[r] * es,
                       rb[r].rc[q] * es);
            break;
        case LOOMI_COLL_BROADCAST: memcpy(B, input_of(c, rb, c->root), n); break;
        case LOOMI_COLL_GATHER:
            if (r == c->root)
                for (int q = 0; q < p; q++) memcpy(B + (size_t)q * n, input_of(c, rb, q), n);
            break;
        case LOOMI_COLL_SCATTER:
            /* In place the root's block stays where it is, in SEND. */
            if (!(r == c->root && c->inplace))
                memcpy(B, input_of(c, rb, c->root) + (size_t)r * n, n);
            break;
        default: break;
        }
    }
    return 0;
}

static loom_result_t start_rank(const struct ccase *c, struct rankbuf *rb, loom_comm_t comm,
                                loom_request_t *req)
{
    const loom_datatype_t t = c->dtype;
    const size_t k = c->count;
    switch (c->coll) {
    case LOOMI_COLL_ALLREDUCE:
        return loom_iallreduce(rb->sendbuf, rb->recvbuf, k, t, c->op, comm, req);
    case LOOMI_COLL_REDUCE_SCATTER:
        return loom_ireduce_scatter(rb->sendbuf, rb->recvbuf, k, t, c->op, comm, req);
    case LOOMI_COLL_ALLGATHER: return loom_iallgather(rb->sendbuf, rb->recvbuf, k, t, comm, req);
    case LOOMI_COLL_ALLTOALL: return loom_ialltoall(rb->sendbuf, rb->recvbuf, k, t, comm, req);
    case LOOMI_COLL_ALLTOALLV:
        return loom_ialltoallv(rb->sendbuf, rb->sc, rb->sd, rb->recvbuf, rb->rc, rb->rd, t, comm,
                               req);
    case LOOMI_COLL_BROADCAST:
        return loom_ibroadcast(rb->sendbuf, rb->recvbuf, k, t, c->root, comm, req);
    case LOOMI_COLL_REDUCE:
        return loom_ireduce(rb->sendbuf, rb->recvbuf, k, t, c->op, c->root, comm, req);
    case LOOMI_COLL_GATHER:
        return loom_igather(rb->sendbuf, rb->recvbuf, k, t, c->root, comm, req);
    case LOOMI_COLL_SCATTER:
        return loom_iscatter(rb->sendbuf, rb->recvbuf, k, t, c->root, comm, req);
    case LOOMI_COLL_BARRIER: return loom_ibarrier(comm, req);
    case LOOMI_COLL_GOSSIP:
        return loom_igossip_average(rb->recvbuf, k, t, c->gmode ? rb->gpeer : LOOM_GOSSIP_SEEDED,
                                    c->round, comm, req);
    default: return LOOM_ERR_INTERNAL;
    }
}

/* Build and validate every rank's schedule.  1: validated, -1: failed
 * (reported). */
static int validate_case(const struct ccase *c, struct rankbuf *rb)
{
    struct loomi_sched *s = calloc((size_t)c->p, sizeof *s);
    struct loomi_coll_args *a = calloc((size_t)c->p, sizeof *a);
    int ret = 1, built = 0;
    char msg[MSG];
    if (!s || !a) {
        fail_case(c, "out of memory");
        ret = -1;
        goto out;
    }
    for (int r = 0; r < c->p; r++) {
        args_for(c, r, &rb[r], &a[r]);
        loom_result_t rc =
            loomi_coll_build(&s[r], r, c->p, c->dtype, c->op, &a[r], c->algo);
        if (rc != LOOM_SUCCESS) {
            fail_case(c, "rank %d: building the schedule failed: %s", r, loom_get_last_error());
            ret = -1;
            goto out;
        }
        built = r + 1;
    }
    struct loomi_validate_stats st;
    if (loomi_sched_validate_coll(s, c->p, a, opt.hazards, &st, msg, sizeof msg) !=
        LOOM_SUCCESS) {
        fail_case(c, "invalid schedule: %s", msg);
        ret = -1;
        goto out;
    }
    cnt.validated++;
    cnt.messages += st.messages;
    cnt.hazard_pairs += st.hazard_pairs;
    cnt.hazard_truncated += (uint64_t)st.hazards_truncated;
out:
    for (int r = 0; r < built; r++) loomi_sched_free(&s[r]);
    free(s);
    free(a);
    return ret;
}

/* Returns -1 when the world must be rebuilt (a failed or hung run). */
static int run_case(struct world *W, const struct ccase *c)
{
    const int p = c->p;
    struct rankbuf *rb = calloc((size_t)p, sizeof *rb);
    int broken = 0;
    char msg[MSG];
    if (!rb) {
        fail_case(c, "out of memory");
        return 0;
    }
    for (int r = 0; r < p; r++)
        if (setup_rank(c, r, &rb[r])) {
            fail_case(c, "out of memory for the buffers");
            goto out;
        }
    if (c->coll == LOOMI_COLL_GOSSIP) {
        /* The pairing must be a matching: each partner names the rank back. */
        for (int r = 0; r < p; r++) rb[r].gpeer = gossip_peer(c, r, W->comms[r]);
        for (int r = 0; r < p; r++) {
            int q = rb[r].gpeer;
            if (q < 0 || q >= p || rb[q].gpeer != r) {
                fail_case(c, "rank %d: partner %d is not a matching's", r, q);
                goto out;
            }
        }
    }
    int v = validate_case(c, rb);
    if (v <= 0) goto out; /* reported: an invalid schedule is not run */
    if (expect_all(c, rb)) {
        fail_case(c, "out of memory for the reference");
        goto out;
    }
    cnt.cases++;
    loom_request_t req[MAXP];
    loom_result_t res[MAXP];
    loomi_sim_world_reseed(W->w, c->seed);
    for (int r = 0; r < p; r++) {
        loomi_comm_force_algo(W->comms[r], c->coll, c->algo);
        loomi_comm_set_chunk_bytes(W->comms[r], c->chunk);
        /* Set per case: a rebuilt world starts without a map.  Cases
         * without a layout run before any layout is set on a world. */
        if (c->lay && loomi_comm_set_hosts(W->comms[r], c->lay->host_of) != LOOM_SUCCESS) {
            fail_case(c, "rank %d: setting the host map failed", r);
            goto out;
        }
        req[r] = LOOM_REQUEST_NULL;
    }
    for (int r = 0; r < p; r++) {
        loom_result_t rc = start_rank(c, &rb[r], W->comms[r], &req[r]);
        if (rc != LOOM_SUCCESS) {
            fail_case(c, "rank %d: starting the call failed: %s", r, loom_get_last_error());
            broken = 1;
            goto out;
        }
    }
    /* A generous cap: two rounds without movement already end a hang. */
    loom_result_t rc = loomi_sim_run(W->w, W->comms, req, p, 10000000, res, msg, sizeof msg);
    if (rc != LOOM_SUCCESS) {
        fail_case(c, "%s", msg);
        broken = 1;
        goto out;
    }
    for (int r = 0; r < p; r++)
        if (res[r] != LOOM_SUCCESS) {
            fail_case(c, "%s", msg);
            broken = 1;
            goto out;
        }
    if (opt.corrupt && rb[p - 1].B.len) {
        /* Self-check (-X): one wrong output byte must be reported. */
        dat(&rb[p - 1].B)[rb[p - 1].B.len / 2] ^= 0x10;
        opt.corrupt = 0;
    }
    for (int r = 0; r < p; r++) {
        if (region_check(&rb[r].A, c->dtype, "send buffer", r, msg, sizeof msg) ||
            region_check(&rb[r].B, c->dtype, "receive buffer", r, msg, sizeof msg)) {
            fail_case(c, "%s", msg);
            goto out;
        }
    }
    if (c->coll == LOOMI_COLL_ALLREDUCE || c->coll == LOOMI_COLL_ALLGATHER ||
        c->coll == LOOMI_COLL_BROADCAST)
        for (int r = 1; r < p; r++)
            if (memcmp(dat(&rb[r].B), dat(&rb[0].B), rb[0].B.len)) {
                fail_case(c, "ranks 0 and %d hold different bits", r);
                goto out;
            }
    if (c->coll == LOOMI_COLL_GOSSIP)
        for (int r = 0; r < p; r++)
            if (memcmp(dat(&rb[r].B), dat(&rb[rb[r].gpeer].B), rb[r].B.len)) {
                fail_case(c, "partners %d and %d hold different bits", r, rb[r].gpeer);
                goto out;
            }
    cnt.equal++;
out:
    if (broken) {
        /* Release what is still running before the buffers go. */
        world_close(W);
        world_open(W, p);
    }
    for (int r = 0; r < p; r++) {
        region_free(&rb[r].A);
        region_free(&rb[r].B);
    }
    free(rb);
    return broken ? -1 : 0;
}

/* ------------------------------------------------------------ the suite */

static int find_name(const char *s, int n, const char *(*name)(int))
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, name(i))) return i;
    return -2;
}
static const char *dname(int i) { return dtype_names[i]; }
static const char *oname(int i) { return op_names[i]; }

static void usage(void)
{
    fprintf(stderr, "usage: sim_exhaustive [-q] [-v] [-H] [-X] [-c coll] [-a algo] [-n nranks] "
                    "[-t dtype] [-o op] [-k count] [-i 0|1] [-r root] [-L layout] [-s seed] "
                    "[-m maxshown]\n");
    exit(2);
}

static void parse(int argc, char **argv)
{
    const char *q = getenv("LOOM_TEST_QUICK");
    if (q && *q && strcmp(q, "0")) opt.quick = 1;
    const char *h = getenv("LOOM_SIM_HAZARDS");
    if (h && !strcmp(h, "0")) opt.hazards = 0;
    const char *sd = getenv("LOOM_SIM_SEED");
    if (sd && *sd) opt.seed = strtoull(sd, NULL, 0);
    int ch;
    while ((ch = getopt(argc, argv, "qvHXc:a:n:t:o:k:i:r:L:s:m:")) != -1) {
        switch (ch) {
        case 'q': opt.quick = 1; break;
        case 'v': opt.verbose = 1; break;
        case 'H': opt.hazards = 0; break;
        case 'X': opt.corrupt = 1; break;
        case 'c': opt.coll = find_name(optarg, LOOMI_NUM_COLLS, loomi_coll_name); break;
        case 'a': opt.algo = find_name(optarg, LOOMI_NUM_ALGOS, loomi_algo_name); break;
        case 'n': opt.nranks = atoi(optarg); break;
        case 't': opt.dtype = find_name(optarg, LOOM_NUM_DATATYPES, dname); break;
        case 'o': opt.op = find_name(optarg, LOOM_NUM_OPS, oname); break;
        case 'k': opt.count = atoll(optarg); break;
        case 'i': opt.inplace = atoi(optarg); break;
        case 'r': opt.root = atoi(optarg); break;
        case 'L': opt.layout = optarg; break;
        case 's': opt.seed = strtoull(optarg, NULL, 0); break;
        case 'm': opt.maxshown = atoi(optarg); break;
        default: usage();
        }
    }
    if (opt.coll == -2 || opt.algo == -2 || opt.dtype == -2 || opt.op == -2) usage();
    if (opt.nranks == 0 || opt.nranks > MAXP) {
        fprintf(stderr, "sim_exhaustive: -n takes 1..%d\n", MAXP);
        exit(2);
    }
}

/* Every case of one collective and algorithm on p ranks (over host
 * layout lay, NULL: none).  lite: fewer types, for the big worlds. */
/* Gossip: every float type, the three pairings, rounds 0..log2(p)+1 of
 * the seeded one; counts as for the others. */
static void suite_gossip(struct world *W, int algo, int p)
{
    const size_t big = opt.quick ? 301 : 1001;
    size_t counts[4] = {1, (size_t)p + 1, big, 0};
    const loom_datatype_t types[4] = {LOOM_FLOAT32, LOOM_FLOAT64, LOOM_FLOAT16, LOOM_BFLOAT16};
    for (int ci = 0; ci < 4; ci++) {
        if (opt.count >= 0 && (size_t)opt.count != counts[ci]) continue;
        for (int k = 0; k < 4; k++) {
            if (opt.dtype >= 0 && opt.dtype != (int)types[k]) continue;
            if (opt.quick && counts[ci] == big && k) continue;
            for (int gm = 0; gm < 3; gm++) {
                int lg = 0;
                while ((2 << lg) <= p) lg++;
                int nrounds = gm ? 1 : 2 + lg;
                for (int rd = 0; rd < nrounds; rd++) {
                    struct ccase c = {.coll = LOOMI_COLL_GOSSIP, .algo = algo, .p = p,
                                      .inplace = 1, .dtype = types[k], .op = LOOM_SUM,
                                      .count = counts[ci], .gmode = gm, .round = (uint64_t)rd};
                    c.chunk = (ci + k) % 2 ? 200 : 64;
                    c.seed = mix(opt.seed ^ mix(((uint64_t)LOOMI_COLL_GOSSIP << 56) ^
                                                ((uint64_t)p << 40) ^ ((uint64_t)c.dtype << 36) ^
                                                ((uint64_t)gm << 32) ^ ((uint64_t)rd << 24) ^
                                                c.count));
                    if (opt.verbose) {
                        char d[256];
                        case_str(&c, d, sizeof d);
                        printf("case %s\n", d);
                        fflush(stdout);
                    }
                    run_case(W, &c);
                    if (!W->w) return;
                }
            }
        }
    }
}

static void suite_coll_algo(struct world *W, int coll, int algo, int p, const struct layout *lay,
                            int lite, int lid)
{
    if (coll == LOOMI_COLL_GOSSIP) {
        if (!lay) suite_gossip(W, algo, p);
        return;
    }
    const size_t big = opt.quick ? 301 : 1001;
    size_t counts[5] = {0, 1, (size_t)p - 1, (size_t)p + 1, big};
    int nc = 0;
    size_t uniq[5];
    for (int i = 0; i < 5; i++) {
        int dup = 0;
        for (int j = 0; j < nc; j++) dup |= uniq[j] == counts[i];
        if (!dup) uniq[nc++] = counts[i];
    }
    if (coll == LOOMI_COLL_BARRIER) nc = 1; /* no buffers: one case */
    /* (type, op) pairs: every type for SUM (the op means nothing to data
     * movers), every op for float32 and int32 for reductions. */
    int tops[LOOM_NUM_DATATYPES + 8][2], nto = 0;
    for (int t = 0; t < LOOM_NUM_DATATYPES; t++) {
        tops[nto][0] = t;
        tops[nto++][1] = LOOM_SUM;
    }
    if (reduces(coll))
        for (int o = LOOM_PROD; o < LOOM_NUM_OPS; o++) {
            tops[nto][0] = LOOM_FLOAT32;
            tops[nto++][1] = o;
            tops[nto][0] = LOOM_INT32;
            tops[nto++][1] = o;
        }
    if (coll == LOOMI_COLL_BARRIER) nto = 1;
    int roots[2] = {0, p - 1}, nroots = rooted(coll) && p > 1 ? 2 : 1;
    int nip = coll == LOOMI_COLL_ALLTOALLV || coll == LOOMI_COLL_BARRIER ? 1 : 2;
    for (int ci = 0; ci < nc; ci++) {
        if (opt.count >= 0 && (size_t)opt.count != uniq[ci]) continue;
        for (int k = 0; k < nto; k++) {
            if (opt.dtype >= 0 && opt.dtype != tops[k][0]) continue;
            if (opt.op >= 0 && reduces(coll) && opt.op != tops[k][1]) continue;
            /* Quick: every type once, the big count with float32 only. */
            if (opt.quick && uniq[ci] == big && tops[k][0] != LOOM_FLOAT32 &&
                tops[k][0] != LOOM_INT32)
                continue;
            /* Lite: one type of each size, every op on float32. */
            if (lite && tops[k][0] != LOOM_FLOAT32 &&
                !(tops[k][1] == LOOM_SUM &&
                  (tops[k][0] == LOOM_INT8 || tops[k][0] == LOOM_FLOAT16 ||
                   tops[k][0] == LOOM_INT64 || (tops[k][0] == LOOM_INT32 && uniq[ci] != big))))
                continue;
            for (int ip = 0; ip < nip; ip++) {
                if (opt.inplace >= 0 && opt.inplace != ip) continue;
                for (int ri = 0; ri < nroots; ri++) {
                    if (opt.root >= 0 && opt.root != roots[ri]) continue;
                    struct ccase c = {
                        .coll = coll, .algo = algo, .p = p, .root = roots[ri], .inplace = ip,
                        .dtype = (loom_datatype_t)tops[k][0],
                        .op = (loom_op_t)tops[k][1], .count = uniq[ci], .lay = lay,
                    };
                    /* Small chunks, some not a multiple of the element size. */
                    c.chunk = (ci + k) % 2 ? 200 : 64;
                    c.seed = mix(opt.seed ^ mix(((uint64_t)coll << 56) ^ ((uint64_t)algo << 48) ^
                                                ((uint64_t)p << 40) ^ ((uint64_t)c.dtype << 36) ^
                                                ((uint64_t)c.op << 32) ^ ((uint64_t)ip << 31) ^
                                                ((uint64_t)c.root << 24) ^
                                                ((uint64_t)lid << 16) ^ c.count));
                    if (opt.verbose) {
                        char d[256];
                        case_str(&c, d, sizeof d);
                        printf("case %s\n", d);
                        fflush(stdout);
                    }
                    run_case(W, &c);
                    if (!W->w) return; /* could not rebuild the world */
                }
            }
        }
    }
}

/* ------------------------------------------------------- host layouts */

static void lay_set(struct layout *l, const char *name, int p, int (*f)(int q, int p))
{
    snprintf(l->name, sizeof l->name, "%s", name);
    for (int q = 0; q < p; q++) l->host_of[q] = f(q, p);
}
static int one_host(int q, int p) { (void)q; (void)p; return 0; }
static int own_host(int q, int p) { (void)p; return q; }
static int alt2(int q, int p) { (void)p; return q % 2; }
static int alt3(int q, int p) { (void)p; return q % 3; }
static int three_one(int q, int p) { (void)p; return q == 3; }
/* Hosts of 5, 1 and 2 ranks, numbered neither by rank nor contiguously. */
static int scrambled(int q, int p)
{
    static const int h[8] = {7, 7, 3, 7, 7, 5, 5, 7};
    (void)p;
    return h[q % 8];
}
static int block_L; /* ranks per host of the uniform block layout being made */
static int block(int q, int p) { (void)p; return q / block_L; }

/* The layouts run at p ranks (at most 8); lite[i]: fewer types.  The
 * first entry may be "none" (no map at all): it must run before any map
 * is set on the world's communicators. */
static int layouts_for(int p, struct layout *out, int *lite)
{
    static const int HL[][2] = {{2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {3, 3}, {2, 6}, {3, 4},
                                {4, 3}, {6, 2}, {2, 8}, {4, 4}, {8, 2}, {4, 6}, {4, 8}, {8, 4},
                                {8, 8}};
    int n = 0;
    if (p == 3) {
        lay_set(&out[n], "none", p, one_host);
        lite[n++] = 1;
        lay_set(&out[n], "one", p, one_host);
        lite[n++] = 1;
        lay_set(&out[n], "each", p, own_host);
        lite[n++] = 1;
    }
    for (size_t k = 0; k < sizeof HL / sizeof *HL; k++) {
        if (HL[k][0] * HL[k][1] != p) continue;
        char name[24];
        snprintf(name, sizeof name, "%dx%d", HL[k][0], HL[k][1]);
        block_L = HL[k][1];
        lay_set(&out[n], name, p, block);
        lite[n++] = p > 16;
    }
    if ((p >= 4 && p <= 6) || p == 9 || p == 13) {
        lay_set(&out[n], "alt2", p, alt2);
        lite[n++] = 0;
    }
    if (p == 7 || p == 17 || p == 33) {
        lay_set(&out[n], "alt3", p, alt3);
        lite[n++] = p > 16;
    }
    if (p == 4) {
        lay_set(&out[n], "3+1", p, three_one);
        lite[n++] = 0;
    }
    if (p == 8) {
        lay_set(&out[n], "5+1+2", p, scrambled);
        lite[n++] = 0;
    }
    return n;
}

/* The hierarchical algorithms over every layout of p ranks. */
static void suite_layouts(struct world *W, int p)
{
    struct layout lays[8];
    int lite[8];
    int n = layouts_for(p, lays, lite);
    for (int li = 0; li < n && W->w; li++) {
        struct layout *l = &lays[li];
        if (opt.layout && strcmp(opt.layout, l->name)) continue;
        int none = !strcmp(l->name, "none");
        l->map = none ? NULL : loomi_hostmap_build(p, l->host_of);
        if (!none && !l->map) {
            printf("FAIL cannot build host layout %s\n", l->name);
            cnt.failures++;
            continue;
        }
        for (int coll = 0; coll < LOOMI_NUM_COLLS && W->w; coll++) {
            if ((opt.coll >= 0 && opt.coll != coll) ||
                !loomi_algo_gen(coll, LOOMI_ALGO_HIERARCHICAL))
                continue;
            suite_coll_algo(W, coll, LOOMI_ALGO_HIERARCHICAL, p, none ? NULL : l, lite[li],
                            li + 1);
        }
        free(l->map);
        l->map = NULL;
    }
}

int main(int argc, char **argv)
{
    setenv("LOOM_DEBUG", "none", 0); /* failures are reported here, not logged */
    /* Keep freed memory for the next case instead of mapping fresh pages
     * (page faults were a fifth of the run time). */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    parse(argc, argv);
    static const int full[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 24, 32, 33, 64};
    static const int quick[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 17};
    const int *ranks = opt.quick ? quick : full;
    int nranks = opt.quick ? (int)(sizeof quick / sizeof *quick) : (int)(sizeof full / sizeof *full);
    double t0 = now_s();
    printf("sim_exhaustive: %s suite, seed %#" PRIx64 ", hazard check %s\n",
           opt.quick ? "quick" : "full", opt.seed, opt.hazards ? "on" : "off");
    for (int pi = 0; pi < nranks; pi++) {
        int p = ranks[pi];
        if (opt.nranks > 0) {
            if (pi) break;
            p = opt.nranks;
        }
        struct world W;
        if (world_open(&W, p)) continue;
        double tp = now_s();
        uint64_t before = cnt.cases;
        for (int coll = 0; coll < LOOMI_NUM_COLLS && W.w; coll++) {
            if (opt.coll >= 0 && opt.coll != coll) continue;
            unsigned algos = loomi_coll_algos(coll);
            for (int algo = 1; algo < LOOMI_NUM_ALGOS && W.w; algo++) {
                if (!(algos & (1u << algo)) || (opt.algo >= 0 && opt.algo != algo)) continue;
                /* Hierarchical: over host layouts, below.  Shared: the
                 * lead's shared-arena tests cover it. */
                if (algo == LOOMI_ALGO_HIERARCHICAL || algo == LOOMI_ALGO_SHARED) continue;
                suite_coll_algo(&W, coll, algo, p, NULL, 0, 0);
            }
        }
        if (W.w && (opt.algo < 0 || opt.algo == LOOMI_ALGO_HIERARCHICAL)) suite_layouts(&W, p);
        /* Flushed: test_exhaustive.sh relays these lines as progress. */
        if (opt.verbose || getenv("LOOM_SIM_TIMES")) {
            printf("  %2d ranks: %" PRIu64 " cases in %.2f s (%d of %d rank counts)\n", p,
                   cnt.cases - before, now_s() - tp, pi + 1, opt.nranks > 0 ? 1 : nranks);
            fflush(stdout);
        }
        if (W.w) world_close(&W);
    }
    double el = now_s() - t0;
    printf("schedules validated: %" PRIu64 " (%" PRIu64 " messages, %" PRIu64
           " hazard checks%s)\n",
           cnt.validated, cnt.messages, cnt.hazard_pairs,
           cnt.hazard_truncated ? ", some truncated" : "");
    printf("cases run: %" PRIu64 ", equal to the reference: %" PRIu64 "\n", cnt.cases, cnt.equal);
    printf("failures: %" PRIu64 "%s\n", cnt.failures,
           cnt.failures > (uint64_t)opt.maxshown ? " (the first ones shown above)" : "");
    printf("delivery order digest: %016" PRIx64 "\n", cnt.digest);
    printf("elapsed: %.1f s\n", el);
    printf("%" PRIu64 " passed, %" PRIu64 " failed\n", cnt.equal, cnt.failures);
    return cnt.failures ? 1 : 0;
}
