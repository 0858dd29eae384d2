/*
 * mp_group.c - one rank of the fused-group test (comm/group.c's fusion).
 *
 * usage: mp_group [ok | count | extra | dtype] [late | lateend]
 *
 * ok (default): several groups, each of about 120 calls drawn with one
 * seed on every rank: allreduce, reduce-scatter and allgather, float32,
 * float64, int32, float16 and bfloat16, sum, max and prod, in place and
 * out of place, from 1 element to 1 MiB; buffers each allocated apart
 * (packed), and runs of allreduces that are views into one buffer (fused
 * with no copy); in two of the groups, runs of float32 calls apart that
 * stage more than 2 MiB each (streamed packing and unpacking, pieces at
 * odd offsets); in the same group a compressed allreduce (codec bf16,
 * kept apart), a broadcast and a ring of send/receive.  Every output is
 * compared with the exact result, every out-of-place input must be
 * unchanged.  The same group is then run again (the staging buffer
 * reused).
 *
 * count: the last rank gives one call in the middle of a group one
 * element more; extra: the last rank queues one more call; dtype: the
 * last rank makes one call float64 where the others make it float32.
 * Every rank's loom_group_end must fail with LOOM_ERR_MISMATCH (none
 * waits for the timeout), and every in-place call must hold its input or
 * its result, nothing else.  A second argument makes rank 0 come 200 ms
 * late: late, into its group (the others find the mismatch and revoke
 * the communicator while it queues its calls: none of them may fail
 * otherwise than with LOOM_ERR_MISMATCH); lateend, to its
 * loom_group_end.
 *
 * Exit 0 only when everything matched.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"
#include "check.h"

static int rank, nranks, failures;


static uint64_t rng;
static uint32_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

/* ---------------------------------------------------------- the types */

static const loom_datatype_t types[] = {LOOM_FLOAT32, LOOM_FLOAT64, LOOM_INT32, LOOM_FLOAT16,
                                        LOOM_BFLOAT16};
static const loom_op_t ops[] = {LOOM_SUM, LOOM_MAX, LOOM_PROD};

static size_t esize(loom_datatype_t t) { return loom_datatype_size(t); }

/* Small integers only: exact in every type. */
static uint16_t to_half(double v)
{
    if (v == 0) return 0;
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, 4);
    int e = (int)(b >> 23 & 0xff) - 127 + 15;
    return (uint16_t)((b >> 16 & 0x8000) | (uint32_t)e << 10 | (b & 0x7fffff) >> 13);
}

static double from_half(uint16_t h)
{
    int e = h >> 10 & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return h & 0x8000 ? -v : v;
}

static void put(void *buf, loom_datatype_t t, size_t i, double v)
{
    switch (t) {
    case LOOM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case LOOM_FLOAT64: ((double *)buf)[i] = v; break;
    case LOOM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = to_half(v); break;
    default: {
        float f = (float)v;
        uint32_t b;
        memcpy(&b, &f, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(b >> 16);
    }
    }
}

static double get(const void *buf, loom_datatype_t t, size_t i)
{
    switch (t) {
    case LOOM_FLOAT32: return ((const float *)buf)[i];
    case LOOM_FLOAT64: return ((const double *)buf)[i];
    case LOOM_INT32: return ((const int32_t *)buf)[i];
    case LOOM_FLOAT16: return from_half(((const uint16_t *)buf)[i]);
    default: {
        uint32_t b = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    }
}

/* Element j of call c's input on rank r (values 1..3; 1..2 for prod,
 * whose products must stay exact in bfloat16). */
static double val(int r, int c, size_t j, loom_op_t op)
{
    return op == LOOM_PROD ? 1 + (double)((r + c + j) % 2) : 1 + (double)((r * 7 + c + j) % 3);
}

static double reduce(int c, size_t j, loom_op_t op)
{
    double a = val(0, c, j, op);
    for (int r = 1; r < nranks; r++) {
        double v = val(r, c, j, op);
        a = op == LOOM_SUM ? a + v : op == LOOM_PROD ? a * v : (v > a ? v : a);
    }
    return a;
}

/* ---------------------------------------------------------- the calls */

enum kind { AR, RS, AG, BCAST, CODEC };

struct call {
    enum kind kind;
    loom_datatype_t t;
    loom_op_t op;
    int inplace, view, borrowed;
    size_t count;   /* the call's count argument */
    void *in, *out; /* out == in (or within it) in place */
    size_t in_n, out_n;
    void *orig; /* a copy of the input, out of place */
};

#define MAXC 256
static struct call calls[MAXC];
static int ncalls;
/* The views' buffers. */
static unsigned char *bucket_in, *bucket_out;

static size_t pick_count(loom_datatype_t t, enum kind k)
{
    static const size_t bytes[] = {1, 2, 7, 13, 100, 1000, 4096, 4096, 4096, 65536, 300000,
                                   (size_t)1 << 20};
    size_t b = bytes[rnd() % (sizeof bytes / sizeof bytes[0])];
    size_t n = b / esize(t);
    if (k != AR) n /= (size_t)nranks; /* the whole buffer stays under 1 MiB */
    return n ? n : 1;
}

static void setup(struct call *c, int idx)
{
    const size_t es = esize(c->t);
    const size_t big = c->count * (size_t)nranks;
    c->in_n = c->kind == RS ? big : c->count;
    c->out_n = c->kind == AG ? big : c->count;
    if (!c->view) {
        if (c->inplace) {
            c->in = malloc((c->kind == AR ? c->count : big) * es);
            c->out = c->in;
        } else {
            c->in = malloc(c->in_n * es);
            c->out = malloc(c->out_n * es);
        }
    }
    /* Inputs; in place the caller's own block within the big buffer. */
    unsigned char *in = c->in;
    if (c->inplace && c->kind == AG) in = (unsigned char *)c->out + (size_t)rank * c->count * es;
    for (size_t j = 0; j < c->in_n; j++) put(in, c->t, j, val(rank, idx, j, c->op));
    if (c->inplace) {
        if (c->kind == AG) c->in = in;
        if (c->kind == RS) c->out = (unsigned char *)c->in + (size_t)rank * c->count * es;
    } else {
        for (size_t j = 0; j < c->out_n; j++) put(c->out, c->t, j, -5);
        c->orig = malloc(c->in_n * es);
        memcpy(c->orig, c->in, c->in_n * es);
    }
}

/* Draw a group: calls apart, then a run of views, both with the same
 * draws on every rank; with big, then runs of float32 calls apart that
 * stage more than 2 MiB each (packed and unpacked with streaming stores:
 * group.h's LOOMI_FUSE_STREAM_BYTES), odd counts among them so that
 * pieces start unaligned in the staging buffer. */
static void draw_big(void)
{
    static const struct { enum kind k; loom_op_t op; int n; } runs[] = {
        {AR, LOOM_SUM, 24}, {RS, LOOM_MAX, 8}, {AG, LOOM_SUM, 8}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
        for (int i = 0; i < runs[r].n; i++) {
            struct call *c = &calls[ncalls];
            memset(c, 0, sizeof *c);
            c->kind = runs[r].k;
            c->t = LOOM_FLOAT32;
            c->op = runs[r].op;
            c->inplace = rnd() % 2;
            /* An allreduce of up to 1 MiB; a reduce-scatter's or an
             * allgather's nranks blocks of up to 1 MiB in all. */
            const size_t most = (c->kind == AR ? (size_t)1 << 18 : ((size_t)1 << 18) / nranks);
            c->count = most / 4 + rnd() % (most - most / 4);
            setup(c, ncalls);
            ncalls++;
        }
}

static void draw(uint64_t seed, int nviews, int views_inplace, int big)
{
    rng = seed;
    ncalls = 0;
    for (int i = 0; i < 100; i++) {
        struct call *c = &calls[ncalls];
        memset(c, 0, sizeof *c);
        uint32_t k = rnd() % 10;
        c->kind = k < 6 ? AR : k < 8 ? RS : AG;
        c->t = types[rnd() % 5];
        c->op = c->kind == AG ? LOOM_SUM : ops[rnd() % 3];
        c->inplace = rnd() % 2;
        c->count = pick_count(c->t, c->kind);
        setup(c, ncalls);
        ncalls++;
    }
    /* A run of float32 sums that lie one after the other. */
    size_t total = 0, counts[64];
    for (int i = 0; i < nviews; i++) total += counts[i] = 1 + rnd() % 3000;
    free(bucket_in);
    free(bucket_out);
    bucket_in = malloc(total * 4);
    bucket_out = views_inplace ? bucket_in : malloc(total * 4);
    size_t off = 0;
    for (int i = 0; i < nviews; i++) {
        struct call *c = &calls[ncalls];
        memset(c, 0, sizeof *c);
        c->kind = AR;
        c->t = LOOM_FLOAT32;
        c->op = LOOM_SUM;
        c->view = 1;
        c->inplace = views_inplace;
        c->count = counts[i];
        c->in = bucket_in + off * 4;
        c->out = bucket_out + off * 4;
        off += counts[i];
        setup(c, ncalls);
        ncalls++;
    }
    if (big) draw_big();
    /* Calls that do not fuse: a compressed allreduce and a broadcast. */
    struct call *c = &calls[ncalls];
    memset(c, 0, sizeof *c);
    c->kind = CODEC;
    c->t = LOOM_FLOAT32;
    c->op = LOOM_SUM;
    c->count = 5000;
    setup(c, ncalls);
    ncalls++;
    c = &calls[ncalls];
    memset(c, 0, sizeof *c);
    c->kind = BCAST;
    c->t = LOOM_INT32;
    c->op = LOOM_SUM;
    c->count = 777;
    c->inplace = 1;
    setup(c, ncalls);
    ncalls++;
}

static void free_calls(void)
{
    for (int i = 0; i < ncalls; i++) {
        struct call *c = &calls[i];
        free(c->orig);
        if (c->view || c->borrowed) continue;
        if (c->inplace) {
            if (c->kind == AG) c->in = (unsigned char *)c->in - (size_t)rank * c->count * esize(c->t);
            free(c->in);
        } else {
            free(c->in);
            free(c->out);
        }
    }
    free(bucket_in);
    if (bucket_out != bucket_in) free(bucket_out);
    bucket_in = bucket_out = NULL;
    ncalls = 0;
}

static loom_result_t issue(loom_comm_t comm, int i, int skew)
{
    struct call *c = &calls[i];
    size_t n = c->count + (size_t)skew;
    switch (c->kind) {
    case AR: return loom_allreduce(c->in, c->out, n, c->t, c->op, comm);
    case RS: return loom_reduce_scatter(c->in, c->out, n, c->t, c->op, comm);
    case AG: return loom_allgather(c->in, c->out, n, c->t, comm);
    case BCAST: return loom_broadcast(c->in, c->in, n, c->t, 0, comm);
    default: {
        const loom_codec_t *codec;
        loom_result_t r = loom_codec_find("bf16", &codec);
        if (r != LOOM_SUCCESS) return r;
        loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
        o.codec = codec;
        return loom_allreduce_opts(c->in, c->out, n, c->t, c->op, comm, &o);
    }
    }
}

/* The p2p ring's buffers. */
static int32_t ring_out[64], ring_in[64];

static loom_result_t ring(loom_comm_t comm)
{
    for (int j = 0; j < 64; j++) ring_out[j] = rank * 100 + j, ring_in[j] = -1;
    loom_result_t r = loom_send(ring_out, 64, LOOM_INT32, (rank + 1) % nranks, comm);
    if (r == LOOM_SUCCESS)
        r = loom_recv(ring_in, 64, LOOM_INT32, (rank + nranks - 1) % nranks, comm);
    return r;
}

static int verify(const char *what)
{
    int bad = 0;
    for (int i = 0; i < ncalls && bad < 5; i++) {
        const struct call *c = &calls[i];
        const size_t es = esize(c->t);
        size_t wrong = 0, first = 0;
        double got = 0, want = 0;
        for (size_t j = 0; j < c->out_n; j++) {
            double w;
            switch (c->kind) {
            case AR:
            case CODEC: w = reduce(i, j, c->op); break;
            case RS: w = reduce(i, (size_t)rank * c->count + j, c->op); break;
            case AG: w = val((int)(j / c->count), i, j % c->count, c->op); break;
            default: w = val(0, i, j, c->op);
            }
            double g = get(c->out, c->t, j);
            if (g != w && !wrong++) first = j, got = g, want = w;
        }
        if (!c->inplace && c->kind != BCAST && memcmp(c->orig, c->in, c->in_n * es)) {
            CHECK(0, "%s: call %d: its input changed (out of place)", what, i);
            bad++;
        }
        if (wrong) {
            CHECK(0, "%s: call %d (kind %d, dtype %d, op %d, count %zu, %s%s): %zu wrong, "
                     "first [%zu] = %g, want %g",
                  what, i, (int)c->kind, (int)c->t, (int)c->op, c->count,
                  c->inplace ? "in place" : "out of place", c->view ? ", view" : "", wrong,
                  first, got, want);
            bad++;
        }
    }
    for (int j = 0; j < 64; j++)
        if (ring_in[j] != ((rank + nranks - 1) % nranks) * 100 + j) {
            CHECK(0, "%s: ring receive [%d] = %d", what, j, ring_in[j]);
            bad++;
            break;
        }
    return bad;
}

/* Where rank 0 comes late (mp_group MODE late | lateend): into its
 * group's calls, or to its loom_group_end. */
static int late_start, late_end;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

static loom_result_t run_group(loom_comm_t comm, int skew_call, int skew, int extra_call)
{
    loom_result_t first = loom_group_start();
    if (late_start && rank == 0) sleep_ms(200);
    for (int i = 0; i < ncalls && first == LOOM_SUCCESS; i++) {
        if (i == ncalls / 2 && first == LOOM_SUCCESS) first = ring(comm);
        loom_result_t r = issue(comm, i, i == skew_call ? skew : 0);
        if (first == LOOM_SUCCESS) first = r;
    }
    if (extra_call >= 0 && first == LOOM_SUCCESS) first = issue(comm, extra_call, 0);
    if (first != LOOM_SUCCESS) {
        (void)loom_group_end();
        return first;
    }
    if (late_end && rank == 0) sleep_ms(200);
    return loom_group_end();
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ok";
    if (argc > 2) {
        late_start = !strcmp(argv[2], "late");
        late_end = !strcmp(argv[2], "lateend");
        if (!late_start && !late_end) {
            fprintf(stderr, "usage: mp_group [ok | count | extra | dtype] [late | lateend]\n");
            return 2;
        }
    }
    loom_comm_t comm;
    loom_result_t r = loom_comm_init_env(&comm, NULL);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "init: %s\n", loom_get_last_error());
        return 1;
    }
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &nranks);
    const int last = rank == nranks - 1;
    if (!strcmp(mode, "ok")) {
        static const struct { uint64_t seed; int views, inplace, big; } g[] = {
            {1, 40, 0, 1}, {2, 64, 1, 0}, {3, 2, 0, 0}, {4, 0, 1, 1}};
        for (size_t k = 0; k < sizeof g / sizeof g[0]; k++) {
            draw(g[k].seed, g[k].views, g[k].inplace, g[k].big);
            char what[64];
            snprintf(what, sizeof what, "group %zu", k);
            r = run_group(comm, -1, 0, -1);
            CHECK(r == LOOM_SUCCESS, "%s: %s: %s", what, loom_strerror(r), loom_get_last_error());
            if (r == LOOM_SUCCESS) verify(what);
            /* Again, the same calls (inputs restored where in place). */
            free_calls();
            draw(g[k].seed, g[k].views, g[k].inplace, g[k].big);
            snprintf(what, sizeof what, "group %zu again", k);
            r = run_group(comm, -1, 0, -1);
            CHECK(r == LOOM_SUCCESS, "%s: %s: %s", what, loom_strerror(r), loom_get_last_error());
            if (r == LOOM_SUCCESS) verify(what);
            free_calls();
        }
        /* The communicator still works for plain calls. */
        double x = rank, y = 0;
        r = loom_allreduce(&x, &y, 1, LOOM_FLOAT64, LOOM_SUM, comm);
        CHECK(r == LOOM_SUCCESS && y == nranks * (nranks - 1) / 2.0, "allreduce after: %s",
              loom_get_last_error());
        if (rank == 0 && !failures)
            printf("rank 0 of %d: 8 fused groups of %d+ calls matched\n", nranks, 100);
    } else {
        draw(7, 10, 0, 0);
        int skew_call = -1, skew = 0, extra = -1, flip = 0;
        /* A call in the middle that fuses (apart, not in place, one
         * element still under the limit). */
        int mid = -1;
        for (int i = ncalls / 2; i < ncalls && mid < 0; i++)
            if (calls[i].kind == AR && !calls[i].view && calls[i].count < 1000 &&
                calls[i].t == LOOM_FLOAT32)
                mid = i;
        for (int i = 0; i < ncalls && mid < 0; i++)
            if (calls[i].kind == AR && !calls[i].view && calls[i].count < 1000) mid = i;
        if (!strcmp(mode, "count")) {
            skew_call = last ? mid : -1;
            skew = 1;
        } else if (!strcmp(mode, "extra")) {
            extra = last ? mid : -1;
        } else if (!strcmp(mode, "dtype")) {
            flip = last; /* below, once its buffers are copied at their own size */
        } else {
            fprintf(stderr, "usage: mp_group [ok | count | extra | dtype] [late | lateend]\n");
            return 2;
        }
        /* The skewed call: buffers with room for one more element, of
         * any of the types (borrowed: not freed by free_calls, as the test
         * ends). */
        if (mid >= 0 && calls[mid].kind == AR) {
            struct call *c = &calls[mid];
            size_t b = (c->count + 1) * 8;
            void *in = calloc(1, b), *out = c->inplace ? in : calloc(1, b);
            memcpy(in, c->in, c->count * esize(c->t));
            if (!c->inplace) memcpy(out, c->out, c->count * esize(c->t));
            free(c->in); /* mid is an allreduce apart: its own buffers */
            if (!c->inplace) free(c->out);
            c->in = in;
            c->out = out;
            c->borrowed = 1;
        }
        if (flip && mid >= 0)
            calls[mid].t = calls[mid].t == LOOM_FLOAT64 ? LOOM_FLOAT32 : LOOM_FLOAT64;
        double t0 = now_s();
        r = run_group(comm, skew_call, skew, extra);
        double dt = now_s() - t0;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", loom_get_last_error());
        CHECK(r == LOOM_ERR_MISMATCH, "%s: loom_group_end gave %s (%s), want LOOM_ERR_MISMATCH",
              mode, loom_strerror(r), msg);
        CHECK(dt < 30, "%s: the failure took %.1f s", mode, dt);
        /* No silent corruption: an in-place allreduce or reduce-scatter
         * holds its input (a fused or failed operation leaves it) or its
         * result (an operation of the group that completed first). */
        for (int i = 0; i < ncalls; i++) {
            const struct call *c = &calls[i];
            if (!c->inplace || (c->kind != AR && c->kind != RS) || i == mid) continue;
            const size_t base = c->kind == RS ? (size_t)rank * c->count : 0;
            int input = 1, result = 1;
            for (size_t j = 0; j < c->count; j++) {
                double g = get(c->out, c->t, j);
                input &= g == val(rank, i, base + j, c->op);
                result &= g == reduce(i, base + j, c->op);
            }
            CHECK(input || result, "%s: call %d (in place) holds neither its input nor its "
                  "result after the failed group", mode, i);
        }
        printf("rank %d of %d: %s: %s after %.2f s: %s\n", rank, nranks, mode, loom_strerror(r),
               dt, msg);
        free_calls();
        /* Destroyed, not aborted: an abort would reach a peer still
         * collecting the verdict as a failure of its own. */
        loom_comm_destroy(comm);
        return failures ? 1 : 0;
    }
    loom_comm_destroy(comm);
    return failures ? 1 : 0;
}
