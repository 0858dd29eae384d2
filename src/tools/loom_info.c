/*
 * loom-info - what this build of Loom is, what the environment makes of
 * it, and what its algorithms would cost (the alpha-beta-gamma model of
 * src/topo/model.h).  Linked statically: it calls library internals.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "core/internal.h"
#include "reduce/reduce.h"
#include "comm/comm.h"
#include "transports/route.h"
#include "topo/model.h"
#include "topo/select.h"
#include "topo/topo.h"

#define PROG "loom-info"
#define MAX_RANKS (1 << 20)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [-n|--ranks N] [--hosts H] [--measure]\n"
            "       " PROG " --job [--explain]   (as every rank of a job: loomrun -n N " PROG
            " --job)\n"
            "       " PROG " --simulate COLL [-n|--ranks N] [--bytes SIZE] [--algo NAME]\n"
            "                 [--dtype TYPE] [--op OP] [--chunk SIZE] [--alpha T] [--beta T]\n"
            "                 [--gamma T] [--gamma-copy T] [--max-steps N] [--measure]\n"
            "       " PROG " --help | --version\n"
            "\n"
            "Without --simulate: the version, the build, the settings the LOOM_*\n"
            "environment resolves to, this host's topology (hwloc, or the XML in\n"
            "LOOM_TOPO_FILE) with N ranks placed on each of H such hosts, the\n"
            "selection table the cost model computes for that job (the one its\n"
            "communicators would use, with the links shown), and each collective's\n"
            "algorithms.\n"
            "\n"
            "  -n, --ranks N    ranks on each host (default: one per core of this host)\n"
            "  --hosts H        hosts like this one in the job (default 1)\n"
            "  --job            join the job the launcher describes; rank 0 prints\n"
            "                   its topology, transports, measured links and the\n"
            "                   selection table every rank uses\n"
            "  --explain        with --job: the cost model's estimate of every\n"
            "                   algorithm at a few sizes\n"
            "\n"
            "  --simulate COLL  estimate every algorithm of COLL (allreduce,\n"
            "                   reduce_scatter, allgather, alltoall, alltoallv,\n"
            "                   broadcast, reduce, gather, scatter, barrier) by an event\n"
            "                   simulation of its schedules and by its closed form, for\n"
            "                   N ranks one per host, all joined by one link class\n"
            "                   (no --hosts: the layout of hosts is the report's)\n"
            "  -n, --ranks N    with --simulate: ranks (default 8)\n"
            "  --bytes SIZE     count x element size as the collective takes it: the\n"
            "                   vector (allreduce, broadcast, reduce), one rank's block\n"
            "                   (reduce_scatter, allgather, gather, scatter) or one\n"
            "                   peer's block (alltoall, alltoallv); 64K, 1M, 1G... (1M)\n"
            "  --algo NAME      only this algorithm (auto: the cost model's choice)\n"
            "  --dtype TYPE     float32 (default), float16, bfloat16, float64, int8,\n"
            "                   uint8, int32, uint32, int64, uint64\n"
            "  --op OP          sum (default), prod, max, min, avg\n"
            "  --chunk SIZE     pipelining chunk (default: LOOM_CHUNK_SIZE, 2M)\n"
            "  --alpha T        seconds per message (20us, 1.5e-5...)\n"
            "  --beta T         seconds per byte on the wire (0.8ns...)\n"
            "  --gamma T        seconds per byte reduced\n"
            "  --gamma-copy T   seconds per byte copied\n"
            "  --max-steps N    simulate only up to N steps over all ranks (16M)\n"
            "  --measure        measure alpha, beta (TCP ping-pong over loopback) and\n"
            "                   gamma (this CPU's reduction kernel) instead of the\n"
            "                   defaults; alone, print them\n");
}

static void vquit(int status, const char *fmt, va_list ap)
{
    fputs(PROG ": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n", stderr);
    exit(status);
}

/* A bad option: status 2. */
static void die(const char *fmt, ...) LOOMI_PRINTF(1, 2);
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vquit(2, fmt, ap);
}

/* A bad environment or a failed measurement: status 1. */
static void fatal(const char *fmt, ...) LOOMI_PRINTF(1, 2);
static void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vquit(1, fmt, ap);
}

/* ------------------------------------------------------------ formatting */

static const char *fmt_time(double s, char *b, size_t n)
{
    if (s < 0) snprintf(b, n, "-");
    else if (s == 0) snprintf(b, n, "0");
    else if (s < 1e-6) snprintf(b, n, "%.3g ns", s * 1e9);
    else if (s < 1e-3) snprintf(b, n, "%.4g us", s * 1e6);
    else if (s < 1) snprintf(b, n, "%.4g ms", s * 1e3);
    else snprintf(b, n, "%.4g s", s);
    return b;
}

/* v in the largest of the five units u (powers of 1024) that divides it. */
static const char *fmt_units(size_t v, char *b, size_t n, const char *const u[5])
{
    int i = 0;
    while (i < 4 && v && v % 1024 == 0) {
        v /= 1024;
        i++;
    }
    snprintf(b, n, "%zu%s", v, u[i]);
    return b;
}

static const char *fmt_size(size_t v, char *b, size_t n)
{
    static const char *const u[] = {" B", " KiB", " MiB", " GiB", " TiB"};
    return fmt_units(v, b, n, u);
}

/* Sizes as LOOM_* variables write them: 512K, 2M, 1G. */
static const char *fmt_size_short(size_t v, char *b, size_t n)
{
    static const char *const u[] = {"", "K", "M", "G", "T"};
    return fmt_units(v, b, n, u);
}

static const char *fmt_count(uint64_t v, char *b, size_t n)
{
    if (v < 10000) snprintf(b, n, "%llu", (unsigned long long)v);
    else if (v < 10000000) snprintf(b, n, "%.1fK", v / 1e3);
    else snprintf(b, n, "%.1fM", v / 1e6);
    return b;
}

/* ------------------------------------------------------------- parsing */

static const char *value(int argc, char **argv, int *i, const char *opt, const char *eq)
{
    if (eq) return eq + 1;
    if (*i + 1 >= argc) die("%s needs a value (see " PROG " --help)", opt);
    return argv[++*i];
}

/* A duration: a number of seconds, or with s, ms, us or ns after it. */
static double parse_time(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double scale = 1;
    if (!strcmp(end, "s") || !*end) scale = 1;
    else if (!strcmp(end, "ms")) scale = 1e-3;
    else if (!strcmp(end, "us")) scale = 1e-6;
    else if (!strcmp(end, "ns")) scale = 1e-9;
    else end = NULL;
    if (errno || end == s || !end || !isfinite(v) || v < 0)
        die("%s: '%s' is not a time such as 20us, 0.8ns or 1.5e-5 (seconds)", opt, s);
    return v * scale;
}

static long long parse_int(const char *opt, const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die("%s: '%s' is not an integer from %lld to %lld", opt, s, lo, hi);
    return v;
}

static size_t parse_bytes(const char *opt, const char *s)
{
    size_t v;
    if (loomi_parse_size(s, &v)) die("%s: '%s' is not a size such as 8, 64K, 1M or 1G", opt, s);
    return v;
}

static int lookup(const char *opt, const char *s, const char *(*name)(int), int n, int first)
{
    for (int i = first; i < n; i++)
        if (!strcmp(s, name(i))) return i;
    char list[512];
    size_t o = 0;
    for (int i = first; i < n && o < sizeof list; i++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i > first ? ", " : "", name(i));
    die("%s: unknown name '%s' (valid: %s)", opt, s, list);
    return -1;
}

static const char *dtype_name(int d) { return loomi_dtype_name((loom_datatype_t)d); }
static const char *op_name(int o) { return loomi_op_name((loom_op_t)o); }

/* --------------------------------------------------------- plain report */

/* Whether a generator is written: build one small schedule. */
static const char *algo_state(int coll, int algo)
{
    struct loomi_coll_args a;
    memset(&a, 0, sizeof a);
    a.coll = coll;
    a.count = coll == LOOMI_COLL_BARRIER ? 0 : 1024;
    a.chunk_bytes = LOOMI_MODEL_CHUNK;
    size_t v[8];
    if (coll == LOOMI_COLL_ALLTOALLV) {
        for (int i = 0; i < 4; i++) {
            v[i] = a.count;
            v[4 + i] = (size_t)i * a.count;
        }
        a.counts = a.rcounts = v;
        a.displs = a.rdispls = v + 4;
    }
    struct loomi_sched s;
    loom_result_t r = loomi_coll_build(&s, 0, 4, LOOM_FLOAT32, LOOM_SUM, &a, algo);
    if (r == LOOM_SUCCESS) {
        loomi_sched_free(&s);
        return NULL;
    }
    return r == LOOM_ERR_UNSUPPORTED ? "not written yet" : "fails to build";
}

/* The sizes that bypass the selection (small.c): max for every
 * collective; lim, where a communicator measured them at init, per
 * collective that puts data in the slots (NULL: none measured). */
static void print_small(size_t max, const size_t *lim, unsigned unmeasured)
{
    char b[32], b2[32];
    if (!max) return;
    printf("  blocking calls with input up to %s: slots in the shared arenas, not the "
           "table\n    (allreduce, allgather, reduce_scatter, alltoall, barrier; "
           "LOOM_SHM_SMALL)\n", fmt_size_short(max, b, sizeof b));
    if (!lim) {
        printf("    each but barrier: up to where they were faster than the table when "
               "measured at init\n");
        return;
    }
    /* Slot bytes: the input of allreduce and allgather, the whole input
     * (every rank's block) of reduce_scatter and alltoall. */
    for (int k = 0; k < LOOMI_SMALL_TUNED; k++)
        printf("    %s: up to %s, %s\n", loomi_coll_name(k),
               lim[k] ? fmt_size_short(lim[k], b2, sizeof b2) : "0 (never)",
               unmeasured >> k & 1 ? "unmeasured (the measuring at init ran out of time)"
                                   : "where they were faster than the table at init");
}

/* The allreduce's sizes timed at init on one host, and what changed
 * (tune.c). */
static void print_tuned(const struct loom_comm *c)
{
    char b[32], b2[32];
    if (!c->timed_lo) return;
    printf("  %s from %s to %s: the table timed at init against the model's "
           "runners-up%s\n",
           loomi_coll_name(LOOMI_COLL_ALLREDUCE), fmt_size_short(c->timed_lo, b, sizeof b),
           fmt_size_short(c->timed_hi, b2, sizeof b2), c->ntuned ? "; taken over:" : "");
    /* The fp32 sums' (class 0) first, then each slower class's. */
    for (int q = 0; q < LOOMI_RED_CLASSES; q++) {
        char pre[32] = "";
        if (q) snprintf(pre, sizeof pre, "reductions of class %d: ", q);
        for (int i = 0; i < c->ntuned; i++)
            if (c->tuned[i].cls == q)
                printf("    %sfrom %s, below %s: %s, not the model's %s\n", pre,
                       fmt_size_short(c->tuned[i].from, b, sizeof b),
                       fmt_size_short(2 * c->tuned[i].from, b2, sizeof b2),
                       loomi_algo_name(c->tuned[i].now), loomi_algo_name(c->tuned[i].was));
    }
}

/* The classes of reductions that rank 0 timed at init (redclass.c),
 * where their allreduces leave the slots, and their tables. */
static void print_red_classes(const struct loom_comm *c)
{
    char b[32], names[1024];
    int any = 0;
    for (int q = 1; q < LOOMI_RED_CLASSES; q++) {
        if (c->red.rep[q][0] == 0xff) continue; /* an empty class */
        loomi_red_class_describe(c, q, names, sizeof names);
        if (!any)
            printf("  allreduce of reductions slower than fp32 sums (timed at init; tables "
                   "of their own%s):\n", c->small_max ? ", and slots" : "");
        any = 1;
        if (c->small_max)
            printf("    class %d, slots up to %s: %s\n", q,
                   fmt_size_short(c->small_lim_red[q], b, sizeof b), names);
        else
            printf("    class %d: %s\n", q, names);
        if (c->sel) loomi_select_print_red(stdout, c->sel, q);
    }
}

/* LOOM_DEBUG as the user set it (main quiets the library's own). */
static const char *user_debug;

/* The job picture of p ranks on each of H copies of this host (p 0: one
 * per core of this host), its links (defaults, LOOM_TUNING_FILE or
 * --measure) and the selection. */
static int report_topology(const struct loomi_settings *set, int p, int H,
                           const struct loomi_model_params *meas)
{
    struct loomi_topo_rank me;
    if (loomi_topo_discover(set, 0, &me) != LOOM_SUCCESS) {
        printf("\ntopology\n  (discovery failed: %s)\n", loom_get_last_error());
        return 1;
    }
    const int cores = me.host.ncores > 0 ? me.host.ncores : 1;
    if (p > 0) {
        printf("\ntopology (%d rank(s) on each of %d host(s) like this one, as --ranks asked)\n",
               p, H);
    } else {
        p = cores;
        printf("\ntopology (%d rank(s) on each of %d host(s) like this one: one per core of "
               "this host; --ranks N for another count)\n",
               p, H);
    }
    if ((long long)p * H > MAX_RANKS) {
        printf("  (%d ranks on each of %d hosts is more than %d ranks)\n", p, H, MAX_RANKS);
        return 1;
    }
    int n = p * H;
    struct loomi_topo_rank *cards = calloc((size_t)n, sizeof *cards);
    if (!cards) fatal("out of memory");
    for (int h = 0; h < H; h++)
        for (int i = 0; i < p; i++) {
            struct loomi_topo_rank *c = &cards[h * p + i];
            *c = me;
            c->pid = me.pid + h * p + i;
            if (H > 1) {
                snprintf(c->host.name, sizeof c->host.name, "%.50s-%d", me.host.name, h);
                c->host.id = me.host.id + (uint64_t)h * 0x9E3779B97F4A7C15ull;
            }
        }
    struct loomi_topo_job job;
    memset(&job, 0, sizeof job);
    if (loomi_topo_job_build(cards, n, &job) != LOOM_SUCCESS) {
        printf("  (job picture failed: %s)\n", loom_get_last_error());
        free(cards);
        return 1;
    }
    loomi_topo_print(stdout, &job);
    unsigned mask = 3;
    int bad = loomi_route_parse(set->transport, &mask, -1) != LOOM_SUCCESS;
    struct loomi_links l;
    loomi_links_defaults(&l, (mask & 2u) != 0);
    if (meas) {
        l.alpha[LOOMI_LINK_INTER] = meas->alpha;
        l.beta[LOOMI_LINK_INTER] = meas->beta;
        l.source[LOOMI_LINK_INTER] = LOOMI_SRC_MEASURED;
        l.gamma = meas->gamma;
        l.gamma_copy = meas->gamma_copy;
    }
    if (set->tuning_file[0] && loomi_links_read(set->tuning_file, &l, -1) != LOOM_SUCCESS) {
        printf("  (%s)\n", loom_get_last_error());
        bad = 1;
    }
    struct loomi_job_shape shape = {.hosts = job.map, .nranks = n,
                                    .cores_per_host = me.host.ncores,
                                    .shared_bytes = (mask & 2u) ? set->shm_bytes : 0,
                                    .stream_bytes = set->shm_stream,
                                    .chunk_bytes = set->chunk_bytes,
                                    .chunk_fixed = set->chunk_fixed};
    struct loomi_selection sel;
    loomi_select_build(&sel, &shape, &l);
    printf("\nlinks\n");
    loomi_links_print(stdout, &l);
    printf("\nselection for %d rank(s) on %d host(s): the algorithm from each size on, as the "
           "cost model\nchooses it with the links above (a real job measures its own links at "
           "creation:\nloomrun -n N " PROG " --job shows its table); LOOM_ALGO overrides\n",
           n, H);
    loomi_select_print(stdout, &sel);
    if (shape.shared_bytes && n > H) {
        printf("once the ranks have loom_mem_alloc windows (loom_mem_alloc(3)):\n");
        loomi_select_print_window(stdout, &sel);
    }
    print_small(loomi_small_limit(set->shm_small, shape.shared_bytes, n, H), NULL, 0);
    loomi_topo_job_free(&job);
    free(cards);
    return bad;
}

/* As one rank of a real job: what its communicator found and chose. */
static int report_job(int explain)
{
    loom_comm_t h;
    loom_result_t r = loom_comm_init_env(&h, NULL);
    if (r != LOOM_SUCCESS) fatal("--job: %s", loom_get_last_error());
    struct loom_comm *comm = loomi_comm_get(h);
    if (comm->rank == 0) {
        char how[128];
        printf("job of %d rank(s) on %d host(s); rank 0's transports: %s\n\n", comm->nranks,
               comm->hosts->nhosts, loomi_route_describe(comm->eng.tstate, how, sizeof how));
        int cores = comm->topo->ranks[0].host.ncores;
        printf("rank 0's machine runs %d rank(s) of the job on %d core(s)%s\n\n",
               comm->machine_ranks, cores,
               comm->eng.oversubscribed ? ": oversubscribed, waiting ranks yield the core between polls"
                                    : "");
        printf("topology\n");
        loomi_topo_print(stdout, comm->topo);
        printf("\nlinks\n");
        if (comm->links) loomi_links_print(stdout, comm->links);
        printf("\nselection (algorithm from size on; LOOM_ALGO overrides)\n");
        if (comm->sel) loomi_select_print(stdout, comm->sel);
        if (comm->sel && comm->shared_bytes && comm->nranks > comm->hosts->nhosts) {
            printf("once the ranks have loom_mem_alloc windows (loom_mem_alloc(3)):\n");
            loomi_select_print_window(stdout, comm->sel);
        }
        print_small(comm->small_max, comm->small_lim, comm->small_unmeasured);
        print_red_classes(comm);
        print_tuned(comm);
        if (comm->links && explain) {
            struct loomi_job_shape j;
            loomi_comm_shape(comm, &j);
            printf("\ncost model\n");
            for (int c = 0; c < LOOMI_NUM_COLLS; c++)
                if (c == LOOMI_COLL_ALLREDUCE || c == LOOMI_COLL_ALLGATHER ||
                    c == LOOMI_COLL_REDUCE_SCATTER || c == LOOMI_COLL_ALLTOALL ||
                    c == LOOMI_COLL_BROADCAST)
                    loomi_select_explain(stdout, c, &j, comm->links);
            if (comm->shared_bytes) {
                j.window = LOOMI_WINDOW_OUT;
                printf("  once the ranks have windows, out of place:\n");
                loomi_select_explain(stdout, LOOMI_COLL_ALLREDUCE, &j, comm->links);
                j.window = LOOMI_WINDOW_IN;
                printf("  in place:\n");
                loomi_select_explain(stdout, LOOMI_COLL_ALLREDUCE, &j, comm->links);
            }
        }
        fflush(stdout);
    }
    r = loom_barrier(h);
    loom_comm_destroy(h);
    return r != LOOM_SUCCESS;
}

/* A streamed-or-cached setting (-1: measured on the first calls, `when`). */
static void print_stores(const char *name, int v, const char *when)
{
    if (v < 0) printf("  %s -1 (measured on the first calls%s)\n", name, when);
    else printf("  %s %s\n", name, v ? "1 (streamed)" : "0 (cached)");
}

static int report(int p, int H, const struct loomi_model_params *meas)
{
    int major, minor, patch, bad = 0;
    loom_get_version(&major, &minor, &patch);
    char b[64];
    printf("Loom %d.%d.%d\n\n", major, minor, patch);
    printf("build\n");
    printf("  transports      %s (the sim transport is in-process, for tests)\n",
           loomi_route_names());
    printf("  reduce kernels  %s (avx2 or neon where this CPU runs it; LOOM_REDUCE_ISA chooses)\n",
           loomi_reduce_isa());

    printf("\nsettings (environment)\n");
    struct loomi_settings set;
    int forced[LOOMI_NUM_COLLS];
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) forced[c] = LOOMI_ALGO_AUTO;
    loom_result_t r = loomi_settings_resolve(&set, NULL, PROG);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, PROG ": %s (%s)\n", loom_get_last_error(), loom_strerror(r));
        printf("  (invalid: %s)\n", loom_get_last_error());
        bad = 1;
    } else {
        printf("  LOOM_TIMEOUT        %d ms\n", set.timeout_ms);
        printf("  LOOM_TCP_STREAMS    %d\n", set.tcp_streams);
        printf("  LOOM_TCP_SOCKBUF    %s\n",
               set.tcp_sockbuf ? fmt_size_short(set.tcp_sockbuf, b, sizeof b)
                               : "0 (kernel autotuning)");
        printf("  LOOM_CHUNK_SIZE     %s\n", fmt_size_short(set.chunk_bytes, b, sizeof b));
        printf("  LOOM_SPIN_US        %d\n", set.spin_us);
        printf("  LOOM_SOCKET_IFNAME  %s\n",
               set.socket_ifname[0] ? set.socket_ifname : "(automatic)");
        printf("  LOOM_TRANSPORT      %s\n",
               set.transport[0] ? set.transport : "(any: shm within a host, tcp between)");
        printf("  LOOM_SHM_SIZE       %s\n", fmt_size_short(set.shm_bytes, b, sizeof b));
        printf("  LOOM_SHM_CMA        %s\n",
               set.shm_cma_min ? fmt_size_short(set.shm_cma_min, b, sizeof b) : "0 (never)");
        printf("  LOOM_SHM_SMALL      %s\n",
               set.shm_small ? fmt_size_short(set.shm_small, b, sizeof b) : "0 (never)");
        printf("  LOOM_SHM_STREAM     %s\n",
               set.shm_stream ? fmt_size_short(set.shm_stream, b, sizeof b) : "0 (never)");
        print_stores("LOOM_SHM_STREAM_SAVES", set.shm_stream_saves, "");
        print_stores("LOOM_SHM_STREAM_COPYIN", set.shm_stream_copyin, " of each size");
        printf("  LOOM_TOPO_FILE      %s\n", set.topo_file[0] ? set.topo_file : "(this machine)");
        printf("  LOOM_HOSTNAME       %s\n", set.hostname[0] ? set.hostname : "(hostname)");
        printf("  LOOM_TUNING_FILE    %s\n", set.tuning_file[0] ? set.tuning_file : "(none)");
        printf("  LOOM_PROBE          %d\n", set.probe);
        printf("  LOOM_ALGO           %s\n", set.algo[0] ? set.algo : "(automatic)");
        r = loomi_algo_parse("LOOM_ALGO", set.algo, forced, -1);
        if (r != LOOM_SUCCESS) {
            fprintf(stderr, PROG ": %s (%s)\n", loom_get_last_error(), loom_strerror(r));
            printf("                      invalid: %s\n", loom_get_last_error());
            bad = 1;
        }
    }
    printf("  LOOM_DEBUG          %s\n", user_debug ? user_debug : "(warn)");
    if (r == LOOM_SUCCESS) bad |= report_topology(&set, p, H, meas);

    printf("\ncollectives and algorithms (the names LOOM_ALGO takes)\n");
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) {
        printf("  %s\n    algorithms  ", loomi_coll_name(c));
        unsigned mask = loomi_coll_algos(c);
        int first = 1;
        for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
            if (!(mask & (1u << a))) continue;
            const char *st = algo_state(c, a);
            printf("%s%s%s%s%s", first ? "" : ", ", loomi_algo_name(a), st ? " (" : "",
                   st ? st : "", st ? ")" : "");
            first = 0;
        }
        printf("\n");
        if (forced[c] != LOOMI_ALGO_AUTO)
            printf("    LOOM_ALGO   forces %s\n", loomi_algo_name(forced[c]));
    }
    return bad;
}

/* ------------------------------------------------------------- measure */

struct src {
    const char *alpha, *beta, *gamma, *gamma_copy;
};

/* An option that sets one of the model's costs, and where it goes. */
struct cost_opt {
    const char *opt;
    double *param;
    const char **src;
};

/* Which of the n cost options opt is, or -1. */
static int cost_index(const struct cost_opt *c, int n, const char *opt)
{
    for (int k = 0; k < n; k++)
        if (!strcmp(opt, c[k].opt)) return k;
    return -1;
}

static void measure(struct loomi_model_params *m, struct src *src)
{
    double a, b, g, gc;
    const size_t cpu_bytes = (size_t)8 << 20, net_bytes = (size_t)4 << 20;
    double t0 = (double)loomi_now_ns();
    loom_result_t r = loomi_model_measure_cpu(cpu_bytes, &g, &gc);
    if (r != LOOM_SUCCESS) fatal("--measure: %s", loom_get_last_error());
    r = loomi_model_measure_net(net_bytes, &a, &b);
    if (r != LOOM_SUCCESS) fatal("--measure: %s", loom_get_last_error());
    double dt = ((double)loomi_now_ns() - t0) * 1e-9;
    m->alpha = a;
    m->beta = b;
    m->gamma = g;
    m->gamma_copy = gc;
    static char sa[96], sg[96], sgc[96];
    snprintf(sa, sizeof sa, "measured: TCP ping-pong over loopback (%.2f s in all)", dt);
    snprintf(sg, sizeof sg, "measured: float32 sum of 8 MiB, %s kernels", loomi_reduce_isa());
    snprintf(sgc, sizeof sgc, "measured: memcpy of 8 MiB");
    src->alpha = sa;
    src->beta = "measured: 4 MiB round trips less 2 alpha";
    src->gamma = sg;
    src->gamma_copy = sgc;
}

static void print_params(const struct loomi_model_params *m, const struct src *src)
{
    char t[32], u[40], r[32];
    const struct {
        const char *name;
        double v;
        const char *src;
    } row[] = {{"alpha", m->alpha, src->alpha},
               {"beta", m->beta, src->beta},
               {"gamma", m->gamma, src->gamma},
               {"gamma_copy", m->gamma_copy, src->gamma_copy}};
    for (int i = 0; i < 4; i++) {
        snprintf(u, sizeof u, "%s%s", fmt_time(row[i].v, t, sizeof t), i ? "/B" : "");
        r[0] = '\0';
        if (i) snprintf(r, sizeof r, "(%.3g GB/s)", 1e-9 / row[i].v);
        printf("  %-11s %-12s %-13s %s\n", row[i].name, u, r, row[i].src);
    }
}

/* ------------------------------------------------------------ simulate */

struct simopts {
    int coll, algo, p, p_given;
    size_t bytes, chunk;
    loom_datatype_t dtype;
    loom_op_t op;
    uint64_t max_steps;
};

/* Returns 1 when a simulation failed (a schedule that cannot run). */
static int simulate(const struct simopts *o, const struct loomi_model_params *m,
                     const struct src *src, int forced)
{
    char b1[32], b2[32], b3[32], b4[32];
    int failed = 0;
    size_t es = loom_datatype_size(o->dtype);
    size_t count = o->bytes / es;
    printf("%s on %d ranks%s, one per host, %s (%zu x %s, %s), chunk %s, root 0, out of place\n",
           loomi_coll_name(o->coll), o->p, o->p_given ? "" : " (the default of --ranks)",
           fmt_size(o->bytes, b1, sizeof b1), count,
           loomi_dtype_name(o->dtype), loomi_op_name(o->op),
           fmt_size(m->chunk_bytes, b2, sizeof b2));
    print_params(m, src);
    printf("\n%-20s %12s %12s %9s %8s %8s\n", "algorithm", "simulated", "closed form",
           "sim/form", "steps", "wall");
    /* Hierarchical algorithms need a host layout: see the selection table. */
    unsigned mask = loomi_coll_algos(o->coll) & ~LOOMI_TOPO_ALGOS;
    /* What a communicator of p ranks, one per host, with these figures
     * would select: the least closed-form time (topo/select.c). */
    double bt;
    const int dflt = loomi_model_best(o->coll, o->p, o->bytes, m, &bt);
    int fastest = LOOMI_ALGO_AUTO;
    double ft = 0;
    for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
        if (!(mask & (1u << a))) continue;
        if (o->algo != LOOMI_ALGO_AUTO && a != o->algo) continue;
        double form = loomi_model_time(o->coll, a, o->p, o->bytes, m);
        struct loomi_model_sim res;
        uint64_t t0 = loomi_now_ns();
        loom_result_t r = loomi_model_simulate(o->coll, a, o->p, o->dtype, o->op, count, m,
                                               o->max_steps, &res);
        double wall = (double)(loomi_now_ns() - t0) * 1e-9;
        char name[40];
        snprintf(name, sizeof name, "%s%s", loomi_algo_name(a),
                 a == forced ? " (forced)" : a == dflt && forced == LOOMI_ALGO_AUTO ? " *" : "");
        fmt_time(form, b2, sizeof b2);
        if (r == LOOM_SUCCESS && !res.over_budget) {
            if (fastest == LOOMI_ALGO_AUTO || res.time < ft) {
                fastest = a;
                ft = res.time;
            }
            printf("%-20s %12s %12s %9.3f %8s %8s\n", name, fmt_time(res.time, b1, sizeof b1),
                   b2, form > 0 ? res.time / form : 1.0, fmt_count(res.steps, b3, sizeof b3),
                   fmt_time(wall, b4, sizeof b4));
        } else if (r == LOOM_SUCCESS) {
            printf("%-20s %12s %12s   too large to simulate (~%s steps > %s), model only\n",
                   name, "-", b2, fmt_count(res.steps, b3, sizeof b3),
                   fmt_count(o->max_steps ? o->max_steps : LOOMI_MODEL_MAX_STEPS, b4, sizeof b4));
        } else if (r == LOOM_ERR_UNSUPPORTED) {
            printf("%-20s %12s %12s   not available (generator not written yet)\n", name, "-", b2);
        } else {
            printf("%-20s %12s %12s   simulation failed: %s\n", name, "-", b2,
                   loom_get_last_error());
            failed = 1;
        }
        fflush(stdout);
    }
    printf("\n* the cost model's choice: %s (%s by closed form), what a job of %d rank(s),\n"
           "  one per host, with these figures selects at this size (LOOM_ALGO aside)\n",
           loomi_algo_name(dflt), fmt_time(bt, b1, sizeof b1), o->p);
    if (fastest != LOOMI_ALGO_AUTO && o->algo == LOOMI_ALGO_AUTO) {
        printf("  fastest simulated: %s (%s)", loomi_algo_name(fastest),
               fmt_time(ft, b1, sizeof b1));
        if (fastest != dflt)
            printf(";\n  where they disagree, trust the simulation: it runs the schedules the library\n"
                   "  runs, which the closed forms only approximate");
        printf("\n");
    }
    return failed;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    /* The tool reports failures itself; the library's warnings would only
     * repeat them (an explicit LOOM_DEBUG still wins). */
    const char *dbg = getenv("LOOM_DEBUG");
    if (dbg && *dbg) user_debug = dbg;
    else setenv("LOOM_DEBUG", "none", 1);

    struct simopts o = {-1, LOOMI_ALGO_AUTO, 8, 0, (size_t)1 << 20, 0, LOOM_FLOAT32, LOOM_SUM, 0};
    struct loomi_model_params m;
    loomi_model_defaults(&m);
    struct src src = {"default: kernel TCP latency between hosts",
                      "default: 10 Gb/s Ethernet", "default: float32 sum on one AVX2 core",
                      "default: memcpy on one core"};
    /* The costs options give: each overrides the default and --measure,
     * and names itself as the cost's source. */
    const struct cost_opt costs[] = {{"--alpha", &m.alpha, &src.alpha},
                 {"--beta", &m.beta, &src.beta},
                 {"--gamma", &m.gamma, &src.gamma},
                 {"--gamma-copy", &m.gamma_copy, &src.gamma_copy}};
    enum { NCOSTS = sizeof costs / sizeof costs[0] };
    double given[NCOSTS] = {0};
    int cost_set[NCOSTS] = {0}, c;
    int do_measure = 0, hosts = 1, job = 0, topo_opts = 0, explain = 0;
    int ranks_set = 0, hosts_set = 0;
    /* The first option that only --simulate takes, to refuse it alone. */
    const char *algo_s = NULL, *coll_s = NULL, *sim_only = NULL;

    for (int i = 1; i < argc; i++) {
        char opt[32];
        const char *arg = argv[i], *eq = strchr(arg, '=');
        size_t ol = eq ? (size_t)(eq - arg) : strlen(arg);
        if (ol >= sizeof opt) ol = sizeof opt - 1;
        memcpy(opt, arg, ol);
        opt[ol] = '\0';
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(opt, "--version")) {
            int ma, mi, pa;
            loom_get_version(&ma, &mi, &pa);
            printf(PROG " (Loom) %d.%d.%d\n", ma, mi, pa);
            return 0;
        } else if (!strcmp(opt, "--simulate")) {
            coll_s = value(argc, argv, &i, opt, eq);
        } else if (!strcmp(opt, "--ranks") || !strcmp(opt, "-n")) {
            o.p = (int)parse_int(opt, value(argc, argv, &i, opt, eq), 1, MAX_RANKS);
            topo_opts = ranks_set = 1;
        } else if (!strcmp(opt, "--hosts")) {
            hosts = (int)parse_int(opt, value(argc, argv, &i, opt, eq), 1, 4096);
            topo_opts = hosts_set = 1;
        } else if (!strcmp(opt, "--job")) {
            if (eq) die("--job takes no value");
            job = 1;
        } else if (!strcmp(opt, "--explain")) {
            if (eq) die("--explain takes no value");
            explain = 1;
        } else if (!strcmp(opt, "--bytes")) {
            if (!sim_only) sim_only = argv[i];
            o.bytes = parse_bytes(opt, value(argc, argv, &i, opt, eq));
        } else if (!strcmp(opt, "--chunk")) {
            if (!sim_only) sim_only = argv[i];
            o.chunk = parse_bytes(opt, value(argc, argv, &i, opt, eq));
            if (!o.chunk) die("--chunk: the chunk size must not be 0");
        } else if (!strcmp(opt, "--algo")) {
            if (!sim_only) sim_only = argv[i];
            algo_s = value(argc, argv, &i, opt, eq);
        } else if (!strcmp(opt, "--dtype")) {
            if (!sim_only) sim_only = argv[i];
            o.dtype = (loom_datatype_t)lookup(opt, value(argc, argv, &i, opt, eq), dtype_name,
                                              LOOM_NUM_DATATYPES, 0);
        } else if (!strcmp(opt, "--op")) {
            if (!sim_only) sim_only = argv[i];
            o.op = (loom_op_t)lookup(opt, value(argc, argv, &i, opt, eq), op_name, LOOM_NUM_OPS, 0);
        } else if ((c = cost_index(costs, NCOSTS, opt)) >= 0) {
            if (!sim_only) sim_only = argv[i];
            given[c] = parse_time(opt, value(argc, argv, &i, opt, eq));
            cost_set[c] = 1;
        } else if (!strcmp(opt, "--max-steps")) {
            if (!sim_only) sim_only = argv[i];
            o.max_steps = (uint64_t)parse_int(opt, value(argc, argv, &i, opt, eq), 1,
                                              (long long)LOOMI_MODEL_STEPS_LIMIT);
        } else if (!strcmp(opt, "--measure")) {
            if (eq) die("--measure takes no value");
            do_measure = 1;
        } else if (arg[0] == '-') {
            die("unknown option '%s' (see " PROG " --help)", opt);
        } else {
            die("unexpected argument '%s' (see " PROG " --help)", arg);
        }
    }

    if (job) return report_job(explain);
    if (coll_s && hosts_set)
        die("--hosts: --simulate estimates N ranks one per host, every pair joined by the same "
            "link; for ranks that share hosts see the selection table of " PROG
            " --ranks N --hosts H");
    if (!coll_s && sim_only) {
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(sim_only, "="), sim_only);
        die("%s is an option of --simulate COLL (see " PROG " --help)", name);
    }
    if ((long long)o.p * hosts > MAX_RANKS)
        die("--ranks %d x --hosts %d is more than %d ranks", o.p, hosts, MAX_RANKS);
    if (!coll_s) {
        if (do_measure && !topo_opts) {
            measure(&m, &src);
            printf("timing model parameters of this host\n");
            print_params(&m, &src);
            return 0;
        }
        if (do_measure) measure(&m, &src);
        /* Without --ranks, one rank per core of this host (0 here). */
        return report(ranks_set ? o.p : 0, hosts, do_measure ? &m : NULL);
    }

    o.coll = lookup("--simulate", coll_s, loomi_coll_name, LOOMI_NUM_COLLS, 0);
    o.p_given = ranks_set;
    int algo_auto = 0;
    if (algo_s) {
        o.algo = lookup("--algo", algo_s, loomi_algo_name, LOOMI_NUM_ALGOS, 0);
        algo_auto = o.algo == LOOMI_ALGO_AUTO; /* resolved below, with the figures */
        if (!algo_auto && !loomi_algo_gen(o.coll, o.algo))
            die("--algo: %s has no algorithm %s", loomi_coll_name(o.coll), algo_s);
        if ((1u << o.algo) & LOOMI_TOPO_ALGOS)
            die("--algo: %s depends on which ranks share a host, which --simulate does not "
                "model; see the selection table of " PROG " --ranks N --hosts H",
                algo_s);
    }
    size_t es = loom_datatype_size(o.dtype);
    if (o.bytes % es)
        die("--bytes: %zu is not a multiple of the %s size %zu", o.bytes,
            loomi_dtype_name(o.dtype), es);
    if (o.coll == LOOMI_COLL_BARRIER) o.bytes = 0;

    /* The chunk and any forced algorithm come from the environment, as
     * they would for a communicator. */
    struct loomi_settings set;
    int forced[LOOMI_NUM_COLLS];
    if (loomi_settings_resolve(&set, NULL, PROG) != LOOM_SUCCESS ||
        loomi_algo_parse("LOOM_ALGO", set.algo, forced, -1) != LOOM_SUCCESS)
        fatal("%s", loom_get_last_error());
    m.chunk_bytes = o.chunk ? o.chunk : set.chunk_bytes;
    if (do_measure) measure(&m, &src);
    for (c = 0; c < NCOSTS; c++)
        if (cost_set[c]) *costs[c].param = given[c], *costs[c].src = costs[c].opt;
    if (m.beta <= 0 || m.gamma <= 0 || m.gamma_copy <= 0)
        die("--beta, --gamma and --gamma-copy must be greater than 0");
    if (algo_auto) o.algo = loomi_model_best(o.coll, o.p, o.bytes, &m, NULL);
    return simulate(&o, &m, &src, forced[o.coll]);
}
