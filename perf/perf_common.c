/*
 * perf_common.c - the nccl-tests style benchmark harness (see
 * perf_common.h): options, test data, timing, checking and output.
 */
#include "perf_common.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

enum {
    EXIT_FAIL = 1,    /* wrong results, failed operation or backend */
    EXIT_USAGE = 2,   /* bad option */
    EXIT_TIMEOUT = 3  /* -T expired */
};

/* The test data repeats with this prime period: fills are memcpy, expected
 * values come from a small table, and power-of-two chunking in an
 * implementation never lines up with the pattern. */
#define PERIOD 4099

/* Magnitude bound for generated values: 0x7F (127), the poison byte, is
 * then never a valid int8/uint8 result. */
#define VALUE_CAP 100

/* At most this many factors of 2 per element in prod, so products stay
 * small (|p| <= 8) and exact in every type. */
#define MAX_TWOS 3

#define POISON_BYTE 0x7F
/* -A: most algorithms one run compares. */
#define PERF_MAX_ALGOS 16
/* -t: most threads (ranks) per process. */
#define PERF_MAX_THREADS 256
#define PERF_MAX_THREADS_STR "256"

/* ---------------------------------------------------------- datatypes */

struct dtype_info {
    const char *name;  /* nccl-tests' name */
    const char *alias;
    size_t size;
    int is_float;
    int is_signed;
    double exact;      /* integers up to this are exact in the type */
    double eps;        /* unit roundoff, for avg's tolerance */
};

static const struct dtype_info dtypes[PERF_NUM_DTYPES] = {
    [PERF_INT8] = {"int8", NULL, 1, 0, 1, 127.0, 0},
    [PERF_UINT8] = {"uint8", NULL, 1, 0, 0, 255.0, 0},
    [PERF_INT32] = {"int32", NULL, 4, 0, 1, 2147483647.0, 0},
    [PERF_UINT32] = {"uint32", NULL, 4, 0, 0, 4294967295.0, 0},
    [PERF_INT64] = {"int64", NULL, 8, 0, 1, 0x1p53, 0},
    [PERF_UINT64] = {"uint64", NULL, 8, 0, 0, 0x1p53, 0},
    [PERF_HALF] = {"half", "fp16", 2, 1, 1, 2048.0, 0x1p-10},
    [PERF_FLOAT] = {"float", "fp32", 4, 1, 1, 0x1p24, 0x1p-23},
    [PERF_DOUBLE] = {"double", "fp64", 8, 1, 1, 0x1p53, 0x1p-52},
    [PERF_BFLOAT16] = {"bfloat16", "bf16", 2, 1, 1, 256.0, 0x1p-7},
};

static const char *const op_names[PERF_NUM_OPS] = {
    [PERF_SUM] = "sum", [PERF_PROD] = "prod", [PERF_MAX] = "max",
    [PERF_MIN] = "min", [PERF_AVG] = "avg"};

static const char *op_name(perf_op_t op)
{
    return op == PERF_OP_NONE ? "none" : op_names[op];
}

static uint16_t float_to_half(float f)
{
    uint32_t x, mant, h, rem, halfway;
    uint16_t sign;
    int exp, e, shift;

    memcpy(&x, &f, sizeof x);
    sign = (uint16_t)((x >> 16) & 0x8000u);
    mant = x & 0x7fffffu;
    exp = (int)((x >> 23) & 0xffu);
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    e = exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal half, or zero */
        if (e < -10)
            return sign;
        mant |= 0x800000u;
        shift = 14 - e;
        h = mant >> shift;
        rem = mant & ((1u << shift) - 1);
        halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    h = ((uint32_t)e << 10) | (mant >> 13);
    rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++; /* a carry rounds up into the exponent, up to infinity */
    return (uint16_t)(sign | h);
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    float f;

    if (exp == 0x1f) {
        x = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    } else {
        x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;

    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* keep NaN a quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);          /* round to nearest even */
    return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;

    memcpy(&f, &x, sizeof f);
    return f;
}

static void store(perf_dtype_t t, void *buf, size_t i, double v)
{
    switch (t) {
    case PERF_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case PERF_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case PERF_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case PERF_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case PERF_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case PERF_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case PERF_HALF: ((uint16_t *)buf)[i] = float_to_half((float)v); break;
    case PERF_FLOAT: ((float *)buf)[i] = (float)v; break;
    case PERF_DOUBLE: ((double *)buf)[i] = v; break;
    case PERF_BFLOAT16: ((uint16_t *)buf)[i] = float_to_bf16((float)v); break;
    default: break;
    }
}

static double load(perf_dtype_t t, const void *buf, size_t i)
{
    switch (t) {
    case PERF_INT8: return ((const int8_t *)buf)[i];
    case PERF_UINT8: return ((const uint8_t *)buf)[i];
    case PERF_INT32: return ((const int32_t *)buf)[i];
    case PERF_UINT32: return ((const uint32_t *)buf)[i];
    case PERF_INT64: return (double)((const int64_t *)buf)[i];
    case PERF_UINT64: return (double)((const uint64_t *)buf)[i];
    case PERF_HALF: return half_to_float(((const uint16_t *)buf)[i]);
    case PERF_FLOAT: return ((const float *)buf)[i];
    case PERF_DOUBLE: return ((const double *)buf)[i];
    case PERF_BFLOAT16: return bf16_to_float(((const uint16_t *)buf)[i]);
    default: return NAN;
    }
}

/* ----------------------------------------------------------- test data */

struct perf_check {
    perf_dtype_t dtype;
    perf_op_t op;
    int nranks;
    int rank;
    int root;
    uint64_t seed;
    int64_t span;     /* |value| bound for sum and avg: exact partial sums */
    double tolerance; /* 0: exact comparison */
    perf_sizes_t sizes;
    double reduced[PERIOD];
};

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c)
{
    return mix64(a ^ mix64(b ^ mix64(c)));
}

/* A uniform integer in [lo, hi]. */
static double pick(uint64_t h, int64_t lo, int64_t hi)
{
    return (double)(lo + (int64_t)(h % (uint64_t)(hi - lo + 1)));
}

/*
 * Small integers, chosen per op so that every partial result, in any
 * order, is exact in the datatype: sums stay within dtypes[].exact,
 * products are +-2^k with k <= MAX_TWOS, and avg's inputs come in pairs
 * (b + t, b - t) so that the sum is exactly nranks * b.
 */
double perf_input(const perf_check_t *c, int rank, size_t i)
{
    const struct dtype_info *t = &dtypes[c->dtype];
    uint64_t k = i % PERIOD, h = hash3((uint64_t)rank, k, c->seed), e;
    int64_t lo, n = c->nranks;

    switch (c->op) {
    case PERF_SUM:
        return pick(h, t->is_signed ? -c->span : 0, c->span);
    case PERF_PROD: {
        double v;
        int64_t twos, start;

        e = hash3(UINT64_MAX, k, c->seed);
        twos = (int64_t)(e % (MAX_TWOS + 1));
        start = (int64_t)((e >> 16) % (uint64_t)n);
        v = ((rank - start + n) % n) < twos ? 2.0 : 1.0;
        if (t->is_signed && ((h >> 40) & 1))
            v = -v;
        return v;
    }
    case PERF_AVG: {
        double b, tt, tmax;

        lo = t->is_signed ? -c->span : 0;
        e = hash3(UINT64_MAX - 1, k, c->seed);
        b = pick(e, lo, c->span);
        if (rank == n - 1 && n % 2 == 1)
            return b;
        tmax = fmin(b - (double)lo, (double)c->span - b);
        tt = pick(hash3((uint64_t)(rank / 2) + (1ull << 32), k, c->seed), 0,
                  (int64_t)tmax);
        return rank % 2 == 0 ? b + tt : b - tt;
    }
    case PERF_MAX:
    case PERF_MIN:
    default:
        return pick(h, t->is_signed ? -VALUE_CAP : 0, VALUE_CAP);
    }
}

double perf_reduced(const perf_check_t *c, size_t i)
{
    return c->reduced[i % PERIOD];
}

int perf_check_nranks(const perf_check_t *c) { return c->nranks; }
int perf_check_root(const perf_check_t *c) { return c->root; }
const perf_sizes_t *perf_check_sizes(const perf_check_t *c)
{
    return &c->sizes;
}

static void check_setup(perf_check_t *c, perf_dtype_t dtype, perf_op_t op,
                        int nranks, int rank, int root)
{
    const struct dtype_info *t = &dtypes[dtype];
    double span = floor(t->exact / nranks);

    c->dtype = dtype;
    c->op = op;
    c->nranks = nranks;
    c->rank = rank;
    c->root = root;
    c->seed = mix64((uint64_t)dtype * 16 + (uint64_t)(op + 1));
    c->span = (int64_t)(span < VALUE_CAP ? span : VALUE_CAP);
    /* avg may be computed as a sum of v/n rounded to the type: allow the
     * rounding of n additions.  Everything else must be exact. */
    c->tolerance = 0;
    if (op == PERF_AVG && t->is_float)
        c->tolerance = (nranks + 2) * t->eps * (c->span > 0 ? c->span : 1);
    if (op == PERF_OP_NONE)
        return;
    for (size_t k = 0; k < PERIOD; k++) {
        double acc = perf_input(c, 0, k);
        for (int r = 1; r < nranks; r++) {
            double v = perf_input(c, r, k);
            switch (op) {
            case PERF_SUM:
            case PERF_AVG: acc += v; break;
            case PERF_PROD: acc *= v; break;
            case PERF_MAX: acc = v > acc ? v : acc; break;
            case PERF_MIN: acc = v < acc ? v : acc; break;
            default: break;
            }
        }
        c->reduced[k] = op == PERF_AVG ? acc / nranks : acc;
    }
}

/* Write perf_input() of this rank into elements [0, n) of buf. */
static void fill_input(const perf_check_t *c, void *buf, size_t n)
{
    size_t ts = dtypes[c->dtype].size, done = n < PERIOD ? n : PERIOD;

    for (size_t i = 0; i < done; i++)
        store(c->dtype, buf, i, perf_input(c, c->rank, i));
    while (done < n) { /* done stays a multiple of PERIOD */
        size_t k = done < n - done ? done : n - done;
        memcpy((char *)buf + done * ts, buf, k * ts);
        done += k;
    }
}

static size_t count_wrong(const perf_check_t *c, const perf_coll_desc_t *coll,
                          const void *buf, size_t n)
{
    size_t wrong = 0;

    for (size_t j = 0; j < n; j++) {
        double want, got;

        if (!coll->expected(c, c->rank, j, &want))
            continue;
        got = load(c->dtype, buf, j);
        if (got == want)
            continue;
        if (c->tolerance > 0 && fabs(got - want) <= c->tolerance)
            continue;
        wrong++; /* NaN (the poison for half) lands here too */
    }
    return wrong;
}

/* With a codec (-Z): the error of a compressed result against the exact
 * one.  e[0] += squared errors, e[1] += squared exact values, e[2] =
 * max(e[2], largest absolute error); returns the elements that are NaN
 * or beyond tol (tol <= 0: NaN only). */
static size_t codec_error(const perf_check_t *c, const perf_coll_desc_t *coll,
                          const void *buf, size_t n, double tol, double e[3])
{
    size_t wrong = 0;

    for (size_t j = 0; j < n; j++) {
        double want, got, d;

        if (!coll->expected(c, c->rank, j, &want))
            continue;
        got = load(c->dtype, buf, j);
        d = fabs(got - want);
        if (got != got) {
            wrong++;
            continue;
        }
        e[0] += d * d;
        e[1] += want * want;
        if (d > e[2])
            e[2] = d;
        if (tol > 0 && d > tol)
            wrong++;
    }
    return wrong;
}

/* How far a codec's result may be from the exact one: its quantum (the
 * error of one encoding, relative to the largest value of a block) times
 * the encodings a value goes through times the largest partial result.
 * 0 (NaN and mismatches only) for codecs without such a bound (topk). */
static double codec_tolerance(const char *spec, const perf_check_t *c,
                              perf_coll_t coll)
{
    static const struct {
        const char *name;
        double q;
    } q[] = {{"bf16", 1.0 / 256}, {"fp16", 1.0 / 2048}, {"int8", 1.0 / 127},
             {"int4", 1.0 / 7},   {"fp4", 1.0 / 3}};
    size_t len = strcspn(spec, ":");
    double hops = coll == PERF_ALLGATHER ? 1 : c->nranks + 1;
    double top = (double)(c->span > 0 ? c->span : 1) *
                 (coll == PERF_ALLGATHER ? 1 : c->nranks);

    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        if (strlen(q[i].name) == len && !strncmp(spec, q[i].name, len))
            return q[i].q * hops * top + 1e-6 * top;
    return 0;
}

/* A 52-bit hash of bytes (exact in a double), to compare ranks. */
static double hash_bytes(const void *buf, size_t n)
{
    const unsigned char *p = buf;
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return (double)(mix64(h) >> 12);
}

/* ------------------------------------------------------------- options */

struct opts {
    size_t minbytes, maxbytes, stepbytes;
    unsigned long stepfactor;
    int iters, warmup, check, blocking, average, timeout;
    int batches; /* -S: time the iterations in this many batches */
    int threads; /* -t: ranks (threads, each with its communicator) per
                    process */
    int regmem;  /* -R 1: buffers from the backend's allocator */
    int root;  /* -1: every rank in turn */
    int dtype; /* -1: all */
    int op;    /* -1: all */
    const char *json;
    const char *codec; /* -Z: NULL: none */
    /* -A: algorithms timed side by side (0: none named, the backend's
     * own choice only); the names point into algo_buf. */
    int nalgos;
    const char *algo[PERF_MAX_ALGOS];
    char algo_buf[512];
};

static const char *prog = "perf";

/* The launcher's rank before the backend is up, so that only one copy of
 * a usage message is printed; -1 when unknown. */
static int env_rank_hint(void)
{
    static const char *const vars[] = {"LOOM_RANK", "OMPI_COMM_WORLD_RANK",
                                       "PMIX_RANK", "PMI_RANK",
                                       "SLURM_PROCID", "RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return atoi(v);
    }
    return -1;
}

static int usage_error(const char *fmt, ...)
{
    va_list ap;

    if (env_rank_hint() > 0)
        return EXIT_USAGE;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s -h' for help.\n", prog);
    return EXIT_USAGE;
}

static void usage(const perf_backend_t *be, const perf_coll_desc_t *coll)
{
    static const char ignored_op[] =
        "\n                        (ignored: no reduction)";
    static const char ignored_root[] =
        "\n                        (ignored: no root)";

    if (env_rank_hint() > 0)
        return;
    printf("Usage: %s [options]\n"
           "Measures %s over the %s backend in the nccl-tests format.\n"
           "\n"
           "  -b, --minbytes N      smallest size in bytes (K/M/G suffixes;"
           " default 32M)\n"
           "  -e, --maxbytes N      largest size in bytes (default 32M)\n"
           "  -f, --stepfactor N    multiply the size by N (default 1: use"
           " -i)\n"
           "  -i, --stepbytes N     else add N bytes (default 1M)\n"
           "  -n, --iters N         timed iterations per size (default 20)\n"
           "  -w, --warmup_iters N  untimed iterations first (default 5)\n"
           "  -c, --check 0|1       check every result (default 1)\n"
           "  -o, --op OP           sum, prod, min, max, avg or all"
           " (default sum)%s\n"
           "  -d, --datatype TYPE   int8, uint8, int32, uint32, int64, uint64,"
           "\n"
           "                        half (fp16), float (fp32), double"
           " (fp64),\n"
           "                        bfloat16 (bf16) or all (default float)\n"
           "  -r, --root N|all      root rank, or all ranks in turn"
           " (default 0)%s\n"
           "  -z, --blocking 0|1    1: blocking calls, 0: non-blocking call"
           " and\n"
           "                        wait (default 1)\n"
           "  -a, --average 0-3     time over ranks: 0 rank 0, 1 mean, 2 min,"
           " 3 max\n"
           "                        (default 1)\n"
           "  -R, --register 0|1    1: one region from the backend's allocator\n"
           "                        holds both buffers (loom_mem_alloc,\n"
           "                        MPI_Alloc_mem; default 0: the heap)\n"
           "  -S, --batches B       time the iterations in B batches and take"
           "\n"
           "                        the median batch (default 1: the mean of"
           " all)\n"
           "  -T, --timeout S       fail if the whole run takes over S seconds"
           "\n"
           "                        (default 0: none)\n"
           "  -J, --json FILE       also write one JSON record per row to"
           " FILE\n"
           "  -A, --algos LIST      time each algorithm of LIST (comma-"
           "separated,\n"
           "                        auto for the automatic choice) in one"
           " job, their\n"
           "                        batches interleaved; one row per"
           " algorithm\n"
           "  -Z, --codec NAME      compress with codec NAME (int8, int4,"
           " fp4,\n"
           "                        bf16, fp16, topk[:F]); float sum/avg"
           " only;\n"
           "                        reports the error against the exact"
           " result\n"
           "  -t, --nthreads T      ranks per process, each a thread with"
           " its own\n"
           "                        communicator (default 1)\n"
           "  -g, --ngpus 0         GPUs per thread: only 0 (none) in this"
           " build\n"
           "  -G, --cudagraph 0     CUDA graph launches: only 0 in this"
           " build\n"
           "  -h, --help            this help\n"
           "\n"
           "Started by a launcher (loomrun, torchrun, srun, mpirun), every"
           " process\n"
           "joins the job; started alone, it runs a job of -t ranks.\n",
           prog, coll->name, be->name, coll->reduces ? "" : ignored_op,
           coll->rooted ? "" : ignored_root);
}

/* A byte count: digits with an optional K, M or G (powers of 1024). */
static int parse_size(const char *s, size_t *out)
{
    unsigned long long v, mult = 1;
    char *end;

    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    switch (*end) {
    case 'k': case 'K': mult = 1ull << 10; end++; break;
    case 'm': case 'M': mult = 1ull << 20; end++; break;
    case 'g': case 'G': mult = 1ull << 30; end++; break;
    default: break;
    }
    if (*end || v > SIZE_MAX / mult)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    long v;
    char *end;

    if (!s || !*s)
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_dtype(const char *s, int *out)
{
    if (!strcmp(s, "all")) {
        *out = -1;
        return 0;
    }
    for (int t = 0; t < PERF_NUM_DTYPES; t++) {
        if (!strcmp(s, dtypes[t].name) ||
            (dtypes[t].alias && !strcmp(s, dtypes[t].alias))) {
            *out = t;
            return 0;
        }
    }
    return -1;
}

static int parse_op(const char *s, int *out)
{
    if (!strcmp(s, "all")) {
        *out = -1;
        return 0;
    }
    for (int o = 0; o < PERF_NUM_OPS; o++) {
        if (!strcmp(s, op_names[o])) {
            *out = o;
            return 0;
        }
    }
    return -1;
}

/* -A: names separated by commas (or spaces), each of letters, digits and
 * '_'; whether the backend knows them is its answer, after init. */
static int parse_algos(const char *s, struct opts *o)
{
    char *save = NULL, *tok;

    if (strlen(s) >= sizeof o->algo_buf)
        return -1;
    strcpy(o->algo_buf, s);
    o->nalgos = 0;
    for (tok = strtok_r(o->algo_buf, ", ", &save); tok;
         tok = strtok_r(NULL, ", ", &save)) {
        if (o->nalgos == PERF_MAX_ALGOS ||
            strspn(tok, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(tok))
            return -1;
        o->algo[o->nalgos++] = tok;
    }
    return o->nalgos ? 0 : -1;
}

/* Returns -1 to go on, else the exit status. */
static int parse_opts(int argc, char **argv, const perf_backend_t *be,
                      const perf_coll_desc_t *coll, struct opts *o)
{
    static const struct option longopts[] = {
        {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'},
        {"stepbytes", required_argument, NULL, 'i'},
        {"stepfactor", required_argument, NULL, 'f'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'},
        {"op", required_argument, NULL, 'o'},
        {"datatype", required_argument, NULL, 'd'},
        {"root", required_argument, NULL, 'r'},
        {"blocking", required_argument, NULL, 'z'},
        {"register", required_argument, NULL, 'R'},
        {"average", required_argument, NULL, 'a'},
        {"batches", required_argument, NULL, 'S'},
        {"timeout", required_argument, NULL, 'T'},
        {"json", required_argument, NULL, 'J'},
        {"codec", required_argument, NULL, 'Z'},
        {"algos", required_argument, NULL, 'A'},
        {"nthreads", required_argument, NULL, 't'},
        {"ngpus", required_argument, NULL, 'g'},
        {"cudagraph", required_argument, NULL, 'G'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int ch, bad, gpu_opt;

    *o = (struct opts){.minbytes = 32u << 20, .maxbytes = 32u << 20,
                       .stepbytes = 1u << 20, .stepfactor = 1, .iters = 20,
                       .warmup = 5, .check = 1, .blocking = 1, .average = 1, .batches = 1,
                       .timeout = 0, .threads = 1, .root = 0, .dtype = PERF_FLOAT,
                       .op = PERF_SUM, .json = NULL};
    opterr = 0; /* our own messages, printed once */
    while ((ch = getopt_long(argc, argv, ":b:e:i:f:n:w:c:o:d:r:z:a:S:T:J:Z:A:R:t:g:G:h",
                             longopts, NULL)) != -1) {
        bad = 0;
        switch (ch) {
        case 'b': bad = parse_size(optarg, &o->minbytes); break;
        case 'e': bad = parse_size(optarg, &o->maxbytes); break;
        case 'i': bad = parse_size(optarg, &o->stepbytes); break;
        case 'f': {
            int f = 1;
            bad = parse_int(optarg, 1, INT_MAX, &f);
            o->stepfactor = (unsigned long)f;
            break;
        }
        case 'n': bad = parse_int(optarg, 1, INT_MAX, &o->iters); break;
        case 'w': bad = parse_int(optarg, 0, INT_MAX, &o->warmup); break;
        case 'c': bad = parse_int(optarg, 0, 1, &o->check); break;
        case 'o': bad = parse_op(optarg, &o->op); break;
        case 'd': bad = parse_dtype(optarg, &o->dtype); break;
        case 'r':
            if (!strcmp(optarg, "all"))
                o->root = -1;
            else
                bad = parse_int(optarg, 0, INT_MAX, &o->root);
            break;
        case 'z': bad = parse_int(optarg, 0, 1, &o->blocking); break;
        case 'R': bad = parse_int(optarg, 0, 1, &o->regmem); break;
        case 'a': bad = parse_int(optarg, 0, 3, &o->average); break;
        case 'S': bad = parse_int(optarg, 1, 1000000, &o->batches); break;
        case 'T': bad = parse_int(optarg, 0, INT_MAX, &o->timeout); break;
        case 'J': o->json = optarg; bad = !*optarg; break;
        case 'Z':
            /* "none" is the uncompressed baseline, checked exactly, so
             * that a sweep over codecs can name it like the others. */
            o->codec = strcmp(optarg, "none") ? optarg : NULL;
            bad = !*optarg;
            if (!bad && coll->id != PERF_ALLREDUCE &&
                coll->id != PERF_REDUCE_SCATTER && coll->id != PERF_ALLGATHER)
                return usage_error("-Z/--codec applies to all_reduce, "
                                   "reduce_scatter and all_gather only");
            break;
        case 'A': bad = parse_algos(optarg, o); break;
        case 't': bad = parse_int(optarg, 1, PERF_MAX_THREADS, &o->threads); break;
        case 'g':
        case 'G':
            /* nccl-tests' GPUs per thread and CUDA graph launches: 0 asks
             * for what this build does (host memory, no graphs). */
            bad = parse_int(optarg, 0, INT_MAX, &gpu_opt);
            if (!bad && gpu_opt != 0)
                return usage_error("-%c %s: GPU options need a GPU build of "
                                   "Loom (this build has none)", ch, optarg);
            break;
        case 'h': usage(be, coll); return 0;
        case ':':
            return usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            if (optopt)
                return usage_error("unknown option '-%c'", optopt);
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
        if (bad) {
            static const char *const want[128] = {
                ['b'] = "a byte count such as 8, 64K, 16M or 1G",
                ['e'] = "a byte count such as 8, 64K, 16M or 1G",
                ['i'] = "a byte count such as 8, 64K, 16M or 1G",
                ['f'] = "an integer >= 1",
                ['n'] = "an integer >= 1",
                ['w'] = "an integer >= 0",
                ['c'] = "0 or 1",
                ['o'] = "sum, prod, min, max, avg or all",
                ['d'] = "int8, uint8, int32, uint32, int64, uint64, half, "
                        "float, double, bfloat16 (fp16, fp32, fp64, bf16) "
                        "or all",
                ['r'] = "a rank (an integer >= 0) or all",
                ['z'] = "0 or 1",
                ['a'] = "0, 1, 2 or 3",
                ['S'] = "an integer from 1 to 1000000",
                ['T'] = "a number of seconds >= 0",
                ['J'] = "a file name",
                ['Z'] = "a codec such as none, int8, int4, fp4, bf16, "
                        "fp16 or topk:0.01",
                ['A'] = "up to 16 algorithm names separated by commas, "
                        "such as auto,ring,recursive_doubling",
                ['t'] = "a number of threads from 1 to " PERF_MAX_THREADS_STR,
                ['g'] = "0 (GPUs per thread; this build has none)",
                ['G'] = "0 (CUDA graph launches; this build has none)"};
            return usage_error("invalid value '%s' for -%c: expected %s",
                               optarg, ch, want[ch]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (o->batches > o->iters)
        return usage_error("-S %d is more than the %d iterations of -n",
                           o->batches, o->iters);
    if (o->nalgos && o->codec)
        return usage_error("-A and -Z exclude each other: a codec fixes the "
                           "algorithm");
    if (o->minbytes > o->maxbytes)
        return usage_error("-b %zu is larger than -e %zu", o->minbytes,
                           o->maxbytes);
    if (o->stepfactor > 1 && o->minbytes == 0)
        return usage_error("-b 0 cannot grow by -f; start at 1 or more");
    if (o->stepfactor <= 1 && o->stepbytes == 0 && o->minbytes < o->maxbytes)
        return usage_error("-i 0 with -f 1 never reaches -e");
    return -1;
}

/* ------------------------------------------------------------ watchdog */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, stop, seconds, rank;
    char phase[256];
} wd = {.mu = PTHREAD_MUTEX_INITIALIZER, .rank = -1};

static void set_phase(const char *fmt, ...)
{
    char buf[sizeof wd.phase];
    va_list ap;

    if (!wd.running)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&wd.mu);
    memcpy(wd.phase, buf, sizeof buf);
    pthread_mutex_unlock(&wd.mu);
}

static void *watchdog_main(void *arg)
{
    struct timespec deadline;

    (void)arg;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += wd.seconds;
    pthread_mutex_lock(&wd.mu);
    while (!wd.stop) {
        if (pthread_cond_timedwait(&wd.cv, &wd.mu, &deadline) == ETIMEDOUT &&
            !wd.stop) {
            if (wd.rank >= 0)
                fprintf(stderr, "%s: rank %d: ", prog, wd.rank);
            else
                fprintf(stderr, "%s: ", prog);
            fprintf(stderr, "timeout: -T %d s expired while running %s\n",
                    wd.seconds, wd.phase);
            fflush(stdout);
            fflush(stderr);
            /* A peer or the backend hangs: do not wait for anything. */
            _exit(EXIT_TIMEOUT);
        }
    }
    pthread_mutex_unlock(&wd.mu);
    return NULL;
}

static int watchdog_start(int seconds)
{
    pthread_condattr_t attr;

    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&wd.cv, &attr);
    pthread_condattr_destroy(&attr);
    wd.seconds = seconds;
    snprintf(wd.phase, sizeof wd.phase, "start-up");
    if (pthread_create(&wd.thread, NULL, watchdog_main, NULL) != 0)
        return -1;
    wd.running = 1;
    return 0;
}

static void watchdog_stop(void)
{
    if (!wd.running)
        return;
    pthread_mutex_lock(&wd.mu);
    wd.stop = 1;
    pthread_cond_signal(&wd.cv);
    pthread_mutex_unlock(&wd.mu);
    pthread_join(wd.thread, NULL);
    wd.running = 0;
}

/* --------------------------------------------------------------- the run */

struct run {
    const perf_backend_t *be;
    const perf_coll_desc_t *coll;
    struct opts o;
    int thread; /* -t: this rank's thread in its process, 0.. */
    int rank, nranks;
    size_t *sizes; /* requested byte counts */
    size_t nsizes;
    char *sendbuf, *recvbuf; /* recvbuf also serves in place */
    FILE *json;
    double busbw_sum;
    long busbw_n;
    double wrong_total;
};

/* An operation failed: say where and stop, without waiting for peers. */
static void fail_call(struct run *r, const perf_call_t *call,
                      const perf_sizes_t *s, const char *where,
                      const char *err)
{
    char root[32] = "";

    if (call->root >= 0)
        snprintf(root, sizeof root, ", root %d", call->root);
    fprintf(stderr,
            "%s: rank %d: %s failed at size %zu B (count %zu), type %s, "
            "op %s%s, %s: %s\n",
            prog, r->rank, r->coll->name, s->bytes, call->count,
            dtypes[call->dtype].name, op_name(call->op), root, where, err);
    fflush(stdout);
    fflush(stderr);
    r->be->abort();
    exit(EXIT_FAIL);
}

static void fail_helper(struct run *r, const char *what, const char *err)
{
    fprintf(stderr, "%s: rank %d: %s failed: %s\n", prog, r->rank, what, err);
    fflush(stdout);
    fflush(stderr);
    r->be->abort();
    exit(EXIT_FAIL);
}

static void run_call(struct run *r, const perf_call_t *call,
                     const perf_sizes_t *s, const char *where)
{
    char err[PERF_ERRLEN] = "";

    if (r->be->run(call, err, sizeof err) != 0)
        fail_call(r, call, s, where, err);
}

/* Number of algorithms a row times: those of -A, else the one the backend
 * chooses. */
static int nalgos(const struct run *r) { return r->o.nalgos ? r->o.nalgos : 1; }

/* Make the calls that follow run algorithm a of -A (nothing without -A). */
static void select_algo(struct run *r, const perf_call_t *call,
                        const perf_sizes_t *s, int a)
{
    char err[PERF_ERRLEN] = "";

    if (r->o.nalgos &&
        r->be->set_algo(call->coll, r->o.algo[a], err, sizeof err) != 0)
        fail_call(r, call, s, "setting the algorithm (-A)", err);
}

/* Time per call of each algorithm into t[a]. */
static void time_calls(struct run *r, const perf_call_t *call,
                       const perf_sizes_t *s, const char *where, double *t)
{
    char err[PERF_ERRLEN] = "";
    const int na = nalgos(r), nb = r->o.batches;

    set_phase("size %zu B (count %zu), type %s, op %s: %s warm-up",
              s->bytes, call->count, dtypes[call->dtype].name,
              op_name(call->op), where);
    for (int a = 0; a < na; a++) {
        select_algo(r, call, s, a);
        for (int k = 0; k < r->o.warmup; k++)
            run_call(r, call, s, where);
    }
    if (r->be->barrier(err, sizeof err) != 0)
        fail_helper(r, "barrier", err);
    set_phase("size %zu B (count %zu), type %s, op %s: %s timing", s->bytes,
              call->count, dtypes[call->dtype].name, op_name(call->op),
              where);
    /* Timed in batches (-S; one by default, the mean over all, as
     * nccl-tests reports it); the first batches take the remainder.  The
     * median batch ignores the ones a descheduling or a neighbour's burst
     * spoiled, which the mean cannot on a shared host.  With -A the
     * algorithms take turns batch by batch, the first one rotating, so
     * that the host's drift hits them alike. */
    double *bt = malloc((size_t)na * (size_t)nb * sizeof *bt);
    if (!bt)
        fail_helper(r, "timing", "out of memory");
    for (int b = 0; b < nb; b++) {
        int n = r->o.iters / nb + (b < r->o.iters % nb);
        for (int j = 0; j < na; j++) {
            int a = (j + b) % na;
            double t0;

            select_algo(r, call, s, a);
            /* One untimed call: the first after a switch pays for the
             * previous algorithm's state (scratch it grew, caches it
             * filled); with 2 calls a batch it decided large rows. */
            if (na > 1)
                run_call(r, call, s, where);
            t0 = now_us();
            for (int k = 0; k < n; k++)
                run_call(r, call, s, where);
            bt[a * nb + b] = (now_us() - t0) / n;
        }
    }
    for (int a = 0; a < na; a++) {
        double *v = bt + a * nb;

        qsort(v, (size_t)nb, sizeof *v, cmp_double);
        t[a] = nb % 2 ? v[nb / 2] : (v[nb / 2 - 1] + v[nb / 2]) / 2;
    }
    free(bt);
}

/* True on every rank only when ok on every rank. */
static int all_ok(struct run *r, int ok)
{
    char err[PERF_ERRLEN] = "";
    double v = ok ? 1.0 : 0.0;

    if (r->be->allreduce_doubles(&v, 1, PERF_MIN, err, sizeof err) != 0)
        fail_helper(r, "allreduce of doubles", err);
    return v > 0.5;
}

static void fmt_time(char *buf, size_t len, double us)
{
    /* As many decimals as fit the 7-character column. */
    int prec = us < 1e4 ? 2 : us < 1e5 ? 1 : 0;

    snprintf(buf, len, "%7.*f", prec, us);
}

static void print_table_head(const struct run *r)
{
    /* With -A a last column names each row's algorithm. */
    const char *al = r->o.nalgos ? "  algorithm" : "";

    printf("#%61s%s%22s%s\n", "", "out-of-place", "", "in-place");
    printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s "
           "%6s%s\n",
           "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
           "#wrong", "time", "algbw", "busbw", "#wrong", al);
    printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s "
           "%6s\n",
           "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "",
           "(us)", "(GB/s)", "(GB/s)", "");
    fflush(stdout);
}

/* Run the check call and count the wrong elements of its result (with a
 * codec: the error statistics into cz and the result's hash into *hash). */
static double check_call(struct run *r, perf_check_t *c, const perf_call_t *call,
                         const perf_sizes_t *s, const char *where, char *res,
                         double tol, double *cz, double *hash)
{
    size_t ts = dtypes[call->dtype].size;

    run_call(r, call, s, where);
    if (r->o.codec) {
        double w = (double)codec_error(c, r->coll, res, s->recv_elems, tol, cz);

        *hash = hash_bytes(res, s->recv_elems * ts);
        return w;
    }
    return (double)count_wrong(c, r->coll, res, s->recv_elems);
}

static void run_row(struct run *r, perf_check_t *c, perf_call_t *call,
                    const perf_sizes_t *s)
{
    size_t ts = dtypes[call->dtype].size;
    size_t ip_elems = s->ip_send_off + s->send_elems;
    const int na = nalgos(r);
    /* Per algorithm and placement (out of place, in place). */
    double t[PERF_MAX_ALGOS][2], wrong[PERF_MAX_ALGOS][2] = {{0, 0}};
    double tp[PERF_MAX_ALGOS], algbw[2], busbw[2];
    /* With a codec (one algorithm): per placement, squared error, squared
     * value, max abs error; and the hash of the result, to compare ranks. */
    double cz[2][3] = {{0, 0, 0}, {0, 0, 0}}, hash[2] = {0, 0};
    double tol = r->o.codec ? codec_tolerance(r->o.codec, c, r->coll->id) : 0;
    char err[PERF_ERRLEN] = "";

    if (s->ip_recv_off + s->recv_elems > ip_elems)
        ip_elems = s->ip_recv_off + s->recv_elems;
    c->sizes = *s;
    call->count = s->count;

    /* Out of place. */
    call->sendbuf = r->sendbuf;
    call->recvbuf = r->recvbuf;
    fill_input(c, r->sendbuf, s->send_elems);
    time_calls(r, call, s, "out-of-place", tp);
    for (int a = 0; a < na; a++)
        t[a][0] = tp[a];
    for (int a = 0; r->o.check && a < na; a++) {
        set_phase("size %zu B, type %s, op %s: out-of-place check", s->bytes,
                  dtypes[call->dtype].name, op_name(call->op));
        select_algo(r, call, s, a);
        fill_input(c, r->sendbuf, s->send_elems);
        memset(r->recvbuf, POISON_BYTE, s->recv_elems * ts);
        wrong[a][0] = check_call(r, c, call, s, "out-of-place check",
                                 r->recvbuf, tol, cz[0], &hash[0]);
    }

    /* In place: one buffer; the timed iterations reuse their own output,
     * as nccl-tests does, and only the check starts from fresh data. */
    call->sendbuf = r->recvbuf + s->ip_send_off * ts;
    call->recvbuf = r->recvbuf + s->ip_recv_off * ts;
    memset(r->recvbuf, POISON_BYTE, ip_elems * ts);
    fill_input(c, r->recvbuf + s->ip_send_off * ts, s->send_elems);
    time_calls(r, call, s, "in-place", tp);
    for (int a = 0; a < na; a++)
        t[a][1] = tp[a];
    for (int a = 0; r->o.check && a < na; a++) {
        set_phase("size %zu B, type %s, op %s: in-place check", s->bytes,
                  dtypes[call->dtype].name, op_name(call->op));
        select_algo(r, call, s, a);
        memset(r->recvbuf, POISON_BYTE, ip_elems * ts);
        fill_input(c, r->recvbuf + s->ip_send_off * ts, s->send_elems);
        wrong[a][1] = check_call(r, c, call, s, "in-place check",
                                 r->recvbuf + s->ip_recv_off * ts, tol,
                                 cz[1], &hash[1]);
    }

    /* Combine over ranks (-a for times; error counts add up). */
    set_phase("size %zu B, type %s, op %s: combining results", s->bytes,
              dtypes[call->dtype].name, op_name(call->op));
    if (r->o.average != 0) {
        static const perf_op_t how[4] = {PERF_SUM, PERF_SUM, PERF_MIN,
                                         PERF_MAX};
        if (r->be->allreduce_doubles(&t[0][0], 2 * (size_t)na,
                                     how[r->o.average], err, sizeof err) != 0)
            fail_helper(r, "allreduce of times", err);
        if (r->o.average == 1) {
            for (int a = 0; a < na; a++) {
                t[a][0] /= r->nranks;
                t[a][1] /= r->nranks;
            }
        }
    }
    if (r->o.check && r->o.codec) {
        /* Every rank must hold the same bytes (allreduce, allgather): a
         * rank whose hash is not the smallest counts one more wrong. */
        double lo[2] = {hash[0], hash[1]}, sums[6], mx[2];

        if (r->coll->id != PERF_REDUCE_SCATTER) {
            if (r->be->allreduce_doubles(lo, 2, PERF_MIN, err, sizeof err) != 0)
                fail_helper(r, "allreduce of hashes", err);
            for (int k = 0; k < 2; k++)
                wrong[0][k] += hash[k] != lo[k];
        }
        for (int k = 0; k < 2; k++) {
            sums[3 * k] = cz[k][0];
            sums[3 * k + 1] = cz[k][1];
            mx[k] = cz[k][2];
        }
        if (r->be->allreduce_doubles(sums, 6, PERF_SUM, err, sizeof err) != 0 ||
            r->be->allreduce_doubles(mx, 2, PERF_MAX, err, sizeof err) != 0)
            fail_helper(r, "allreduce of errors", err);
        for (int k = 0; k < 2; k++) {
            cz[k][0] = sums[3 * k + 1] > 0 ? sqrt(sums[3 * k] / sums[3 * k + 1])
                                           : sqrt(sums[3 * k]);
            cz[k][2] = mx[k];
        }
    }
    if (r->o.check &&
        r->be->allreduce_doubles(&wrong[0][0], 2 * (size_t)na, PERF_SUM, err,
                                 sizeof err) != 0)
        fail_helper(r, "allreduce of error counts", err);

    for (int a = 0; a < na; a++) {
        r->wrong_total += wrong[a][0] + wrong[a][1];
        for (int k = 0; k < 2; k++) {
            algbw[k] = t[a][k] > 0 ? (double)s->bytes / (t[a][k] * 1e3) : 0;
            busbw[k] = algbw[k] * r->coll->busbw_factor(r->nranks);
            r->busbw_sum += busbw[k];
            r->busbw_n++;
        }
        if (r->rank != 0)
            continue;
        {
            char tm[2][32], wr[2][32], al[80] = "";
            for (int k = 0; k < 2; k++) {
                fmt_time(tm[k], sizeof tm[k], t[a][k]);
                if (r->o.check)
                    snprintf(wr[k], sizeof wr[k], "%.0f", wrong[a][k]);
                else
                    snprintf(wr[k], sizeof wr[k], "N/A");
            }
            if (r->o.nalgos)
                snprintf(al, sizeof al, "  %s", r->o.algo[a]);
            printf("%12zu  %12zu  %8s  %6s  %6d"
                   "  %7s  %6.2f  %6.2f  %5s  %7s  %6.2f  %6.2f  %5s%s\n",
                   s->bytes, s->elems, dtypes[call->dtype].name,
                   op_name(call->op), call->root, tm[0], algbw[0], busbw[0],
                   wr[0], tm[1], algbw[1], busbw[1], wr[1], al);
            if (r->o.codec && r->o.check)
                printf("#  codec %s error: out-of-place rel_l2 %.3e max_abs "
                       "%.3e, in-place rel_l2 %.3e max_abs %.3e (tolerance "
                       "%.3g)\n",
                       r->o.codec, cz[0][0], cz[0][2], cz[1][0], cz[1][2], tol);
            fflush(stdout);
        }
        if (r->json) {
            fprintf(r->json,
                    "{\"collective\":\"%s\",\"backend\":\"%s\",\"nranks\":%d,"
                    "\"size\":%zu,\"count\":%zu,\"type\":\"%s\","
                    "\"redop\":\"%s\",\"root\":%d,\"blocking\":%d,"
                    "\"iters\":%d,\"warmup_iters\":%d,\"average\":%d,"
                    "\"batches\":%d",
                    r->coll->name, r->be->name, r->nranks, s->bytes, s->elems,
                    dtypes[call->dtype].name, op_name(call->op), call->root,
                    r->o.blocking, r->o.iters, r->o.warmup, r->o.average,
                    r->o.batches);
            if (r->o.nalgos)
                fprintf(r->json, ",\"algorithm\":\"%s\"", r->o.algo[a]);
            for (int k = 0; k < 2; k++) {
                const char *p = k == 0 ? "oop" : "ip";
                fprintf(r->json,
                        ",\"%s_time_us\":%.3f,\"%s_algbw\":%.6f,"
                        "\"%s_busbw\":%.6f,\"%s_wrong\":",
                        p, t[a][k], p, algbw[k], p, busbw[k], p);
                if (r->o.check)
                    fprintf(r->json, "%.0f", wrong[a][k]);
                else
                    fputs("null", r->json);
                if (r->o.codec && r->o.check)
                    fprintf(r->json, ",\"%s_rel_l2\":%.6e,\"%s_max_abs\":%.6e",
                            p, cz[k][0], p, cz[k][2]);
            }
            if (r->o.codec)
                fprintf(r->json, ",\"codec\":\"%s\"", r->o.codec);
            fputs("}\n", r->json);
            fflush(r->json);
        }
    }
}

/* The requested sizes, as nccl-tests steps them. */
static int plan_sizes(struct run *r)
{
    size_t cap = 64, n = 0, b = r->o.minbytes, next;

    r->sizes = malloc(cap * sizeof *r->sizes);
    if (!r->sizes)
        return -1;
    for (;;) {
        if (n == cap) {
            size_t *p = realloc(r->sizes, 2 * cap * sizeof *p);
            if (!p)
                return -1;
            r->sizes = p;
            cap *= 2;
        }
        r->sizes[n++] = b;
        if (r->o.stepfactor > 1) {
            if (b > SIZE_MAX / r->o.stepfactor)
                break;
            next = b * r->o.stepfactor;
        } else {
            if (r->o.stepbytes == 0 || b > SIZE_MAX - r->o.stepbytes)
                break;
            next = b + r->o.stepbytes;
        }
        if (next > r->o.maxbytes)
            break;
        b = next;
    }
    r->nsizes = n;
    return 0;
}

static void *alloc_buffer(size_t bytes)
{
    void *p = NULL;

    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return NULL;
    memset(p, 0, bytes); /* touch the pages before timing */
    return p;
}

static void print_banner(struct run *r)
{
    char host[256] = "?";
    char step[64], root[32], extra[512] = "";

    gethostname(host, sizeof host - 1);
    if (r->o.stepfactor > 1)
        snprintf(step, sizeof step, "%lu(factor)", r->o.stepfactor);
    else
        snprintf(step, sizeof step, "%zu(bytes)", r->o.stepbytes);
    if (!r->coll->rooted)
        snprintf(root, sizeof root, "-1");
    else if (r->o.root < 0)
        snprintf(root, sizeof root, "all");
    else
        snprintf(root, sizeof root, "%d", r->o.root);
    if (r->o.threads > 1)
        printf("# %s: backend %s, nranks %d (%d process%s x %d threads)\n",
               prog, r->be->name, r->nranks, r->nranks / r->o.threads,
               r->nranks / r->o.threads == 1 ? "" : "es", r->o.threads);
    else
        printf("# %s: backend %s, nranks %d\n", prog, r->be->name, r->nranks);
    if (r->be->describe)
        r->be->describe(extra, sizeof extra);
    if (*extra)
        printf("# %s\n", extra);
    printf("# minBytes %zu maxBytes %zu step: %s warmup iters: %d "
           "iters: %d validation: %d blocking: %d average: %d timeout: %d\n",
           r->o.minbytes, r->o.maxbytes, step, r->o.warmup, r->o.iters,
           r->o.check, r->o.blocking, r->o.average, r->o.timeout);
    if (r->o.regmem)
        printf("# buffers: from the %s backend's allocator (-R 1)\n", r->be->name);
    if (r->o.batches > 1)
        printf("# time: median of %d batches of the iterations\n",
               r->o.batches);
    if (r->o.nalgos) {
        printf("# algorithms (-A), batches interleaved:");
        for (int a = 0; a < r->o.nalgos; a++)
            printf(" %s", r->o.algo[a]);
        printf("\n");
    }
    printf("# datatype: %s  op: %s  root: %s  json: %s\n",
           r->o.dtype < 0 ? "all" : dtypes[r->o.dtype].name,
           !r->coll->reduces ? "none"
           : r->o.op < 0     ? "all"
                             : op_names[r->o.op],
           root, r->o.json ? r->o.json : "-");
    if (r->o.codec)
        printf("# codec: %s (error against the exact result below each "
               "row; #wrong: NaN, beyond tolerance or ranks differing)\n",
               r->o.codec);
    printf("#\n#  Rank %2d Pid %6ld on %s\n#\n", r->rank, (long)getpid(),
           host);
}

/* One (type, op, root) series: a row per size. */
static void run_series(struct run *r, perf_check_t *check, perf_dtype_t t,
                       perf_op_t op, int root)
{
    perf_call_t call = {
        .coll = r->coll->id, .dtype = t, .op = op, .root = root,
        .peer = -1, .recv_peer = -1, .blocking = r->o.blocking,
        .codec = r->o.codec};
    const char *why = "";
    size_t last_bytes = SIZE_MAX;

    if (r->coll->peered) {
        call.peer = (r->rank + 1) % r->nranks;
        call.recv_peer = (r->rank + r->nranks - 1) % r->nranks;
    }
    if (!r->be->supports(&call, &why)) {
        int first_root = r->o.root < 0 ? 0 : r->o.root;

        /* Once per type and op, not per root. */
        if (r->rank == 0 && (root < 0 || root == first_root)) {
            printf("# Skipping %s %s: not supported by the %s backend (%s)\n",
                   dtypes[t].name, op_name(op), r->be->name, why);
            fflush(stdout);
        }
        return;
    }
    set_phase("type %s, op %s, root %d: computing expected values",
              dtypes[t].name, op_name(op), root);
    check_setup(check, t, op, r->nranks, r->rank, root);
    for (size_t k = 0; k < r->nsizes; k++) {
        perf_sizes_t s = {0};

        r->coll->sizes(r->sizes[k], dtypes[t].size, r->nranks, r->rank, &s);
        /* Sizes below one element (per rank, where the size is the total
         * buffer), or that round down to the row before, add nothing. */
        if (s.count == 0 || s.bytes == last_bytes)
            continue;
        last_bytes = s.bytes;
        run_row(r, check, &call, &s);
    }
}

/* One rank, from its backend's initialisation on; returns its exit
 * status. */
static int run_rank(struct run *r)
{
    const perf_backend_t *be = r->be;
    const perf_coll_desc_t *coll = r->coll;
    char err[PERF_ERRLEN] = "";
    size_t max_send = 0, max_recv = 0;
    void *region = NULL; /* -R 1: both buffers, from the backend */
    perf_check_t *check;
    int rc, t_lo, t_hi, o_lo, o_hi, r_lo, r_hi;

    r->rank = be->rank();
    r->nranks = be->size();
    if (r->thread == 0) {
        pthread_mutex_lock(&wd.mu);
        wd.rank = r->rank;
        pthread_mutex_unlock(&wd.mu);
    }

    /* Checks every rank can do alone, so all exit alike. */
    if (coll->rooted && r->o.root >= r->nranks) {
        if (r->rank == 0)
            usage_error("-r %d is not a rank of this job (%d ranks)",
                        r->o.root, r->nranks);
        be->finalize(err, sizeof err);
        return EXIT_USAGE;
    }

    /* -A: every name must be an algorithm of this collective. */
    if (r->o.nalgos) {
        rc = 1;
        if (!be->set_algo) {
            if (r->rank == 0)
                usage_error("-A: the %s backend cannot choose algorithms",
                            be->name);
            rc = 0;
        }
        for (int a = 0; rc && a < r->o.nalgos; a++) {
            if (be->set_algo((perf_coll_t)coll->id, r->o.algo[a], err,
                             sizeof err) != 0) {
                if (r->rank == 0)
                    usage_error("-A: %s", err);
                rc = 0;
            }
        }
        if (!rc) {
            be->finalize(err, sizeof err);
            return EXIT_USAGE;
        }
    }

    rc = 1;
    if (r->rank == 0 && r->o.json) {
        r->json = fopen(r->o.json, "w");
        if (!r->json) {
            fprintf(stderr, "%s: cannot write -J %s: %s\n", prog, r->o.json,
                    strerror(errno));
            rc = 0;
        }
    }
    if (!all_ok(r, rc)) {
        be->finalize(err, sizeof err);
        return EXIT_USAGE;
    }

    t_lo = r->o.dtype < 0 ? 0 : r->o.dtype;
    t_hi = r->o.dtype < 0 ? PERF_NUM_DTYPES - 1 : r->o.dtype;
    o_lo = !coll->reduces ? PERF_OP_NONE : r->o.op < 0 ? 0 : r->o.op;
    o_hi = !coll->reduces ? PERF_OP_NONE
           : r->o.op < 0  ? PERF_NUM_OPS - 1
                          : r->o.op;
    r_lo = !coll->rooted ? -1 : r->o.root < 0 ? 0 : r->o.root;
    r_hi = !coll->rooted ? -1 : r->o.root < 0 ? r->nranks - 1 : r->o.root;

    /* Buffers for the largest row of any type. */
    rc = plan_sizes(r) == 0;
    for (int t = t_lo; rc && t <= t_hi; t++) {
        for (size_t k = 0; k < r->nsizes; k++) {
            perf_sizes_t s = {0};
            size_t ts = dtypes[t].size, ip;

            coll->sizes(r->sizes[k], ts, r->nranks, r->rank, &s);
            ip = s.ip_send_off + s.send_elems;
            if (s.ip_recv_off + s.recv_elems > ip)
                ip = s.ip_recv_off + s.recv_elems;
            if (s.send_elems * ts > max_send)
                max_send = s.send_elems * ts;
            if (s.recv_elems * ts > max_recv)
                max_recv = s.recv_elems * ts;
            if (ip * ts > max_recv)
                max_recv = ip * ts;
        }
    }
    check = malloc(sizeof *check);
    if (rc && r->o.regmem) {
        /* One region for both, as a window must hold them (loom). */
        size_t at = (max_send + 4095) / 4096 * 4096;
        if (!be->mem_alloc) {
            snprintf(err, sizeof err, "the backend has no allocator of its own");
            region = NULL;
        } else {
            region = be->mem_alloc(at + (max_recv ? max_recv : 64), err, sizeof err);
        }
        if (region) {
            memset(region, 0, at + max_recv); /* touch the pages before timing */
            r->sendbuf = region;
            r->recvbuf = (char *)region + at;
        } else {
            fprintf(stderr, "%s: rank %d: -R 1: %s\n", prog, r->rank, err);
        }
    } else if (rc) {
        r->sendbuf = alloc_buffer(max_send);
        r->recvbuf = alloc_buffer(max_recv);
    }
    rc = rc && check && r->sendbuf && r->recvbuf;
    if (!rc)
        fprintf(stderr, "%s: rank %d: cannot allocate %zu + %zu bytes\n", prog,
                r->rank, max_send, max_recv);
    if (!all_ok(r, rc)) {
        be->finalize(err, sizeof err);
        return EXIT_FAIL;
    }

    if (r->rank == 0) {
        print_banner(r);
        print_table_head(r);
    }
    for (int t = t_lo; t <= t_hi; t++) {
        for (int op = o_lo; op <= o_hi; op++) {
            for (int root = r_lo; root <= r_hi; root++)
                run_series(r, check, (perf_dtype_t)t, (perf_op_t)op, root);
        }
    }

    if (r->rank == 0) {
        printf("# Out of bounds values : %.0f %s\n", r->wrong_total,
               r->wrong_total > 0 ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n#\n",
               r->busbw_n ? r->busbw_sum / (double)r->busbw_n : 0.0);
        fflush(stdout);
    }
    if (r->json)
        fclose(r->json);
    set_phase("backend finalisation");
    if (region) {
        be->mem_free(region);
        r->sendbuf = r->recvbuf = NULL;
    }
    rc = be->finalize(err, sizeof err);
    free(r->sendbuf);
    free(r->recvbuf);
    free(r->sizes);
    free(check);
    if (rc != 0) {
        fprintf(stderr, "%s: rank %d: %s backend: finalisation failed: %s\n",
                prog, r->rank, be->name, err);
        return EXIT_FAIL;
    }
    return r->wrong_total > 0 ? EXIT_FAIL : 0;
}

struct rank_thread {
    struct run run;
    pthread_t tid;
    int started, rc;
};

static void *rank_thread_main(void *arg)
{
    struct rank_thread *th = arg;
    struct run *r = &th->run;
    char err[PERF_ERRLEN] = "";

    if (r->be->thread_init(r->thread, err, sizeof err) != 0) {
        fprintf(stderr, "%s: thread %d: %s backend: initialisation failed: "
                        "%s\n",
                prog, r->thread, r->be->name, err);
        th->rc = EXIT_FAIL;
        return NULL;
    }
    th->rc = run_rank(r);
    return NULL;
}

/* -t T: T ranks in this process, a thread each. */
static int run_threads(const struct run *proto)
{
    const perf_backend_t *be = proto->be;
    const int n = proto->o.threads;
    struct rank_thread *th;
    char err[PERF_ERRLEN] = "";
    int rc = 0;

    if (!be->setup_threads || !be->thread_init)
        return usage_error("-t %d: the %s backend runs one rank per process",
                           n, be->name);
    th = calloc((size_t)n, sizeof *th);
    if (!th) {
        fprintf(stderr, "%s: out of memory for %d threads\n", prog, n);
        return EXIT_FAIL;
    }
    set_phase("backend initialisation");
    if (be->setup_threads(n, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s backend: initialisation failed: %s\n", prog,
                be->name, err);
        free(th);
        return EXIT_FAIL;
    }
    for (int t = 0; t < n; t++) {
        th[t].run = *proto;
        th[t].run.thread = t;
        if (pthread_create(&th[t].tid, NULL, rank_thread_main, &th[t]) != 0) {
            /* The job cannot form without this rank: the others fail at
             * their bootstrap deadline. */
            fprintf(stderr, "%s: cannot start thread %d of %d\n", prog, t, n);
            rc = EXIT_FAIL;
            break;
        }
        th[t].started = 1;
    }
    for (int t = 0; t < n; t++) {
        if (!th[t].started)
            continue;
        pthread_join(th[t].tid, NULL);
        if (th[t].rc > rc)
            rc = th[t].rc;
    }
    free(th);
    return rc;
}

int perf_main(int argc, char **argv, const perf_backend_t *be,
              const perf_coll_desc_t *coll)
{
    struct run run = {.be = be, .coll = coll};
    struct run *r = &run;
    char err[PERF_ERRLEN] = "";
    int rc;

    if (argv && argv[0]) {
        const char *slash = strrchr(argv[0], '/');
        prog = slash ? slash + 1 : argv[0];
    }
    rc = parse_opts(argc, argv, be, coll, &r->o);
    if (rc >= 0)
        return rc;
    if (r->o.timeout > 0 && watchdog_start(r->o.timeout) != 0) {
        fprintf(stderr, "%s: cannot start the -T watchdog thread\n", prog);
        return EXIT_FAIL;
    }

    if (r->o.threads > 1) {
        rc = run_threads(r);
    } else {
        set_phase("backend initialisation");
        if (be->init(&argc, &argv, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s backend: initialisation failed: %s\n",
                    prog, be->name, err);
            return EXIT_FAIL;
        }
        rc = run_rank(r);
    }
    watchdog_stop();
    return rc;
}
