/* select.c - the cost model's choice of algorithm (see select.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "topo/model.h"
#include "topo/select.h"

/* Shared memory between two processes of one host: a cache line handed
 * over (~1 us with the polling loop) and a copy's bandwidth. */
#define SHM_ALPHA 2e-6
#define SHM_BETA 0.15e-9

void loomi_links_defaults(struct loomi_links *l, int intra_shm)
{
    memset(l, 0, sizeof *l);
    l->intra_shm = intra_shm;
    l->alpha[LOOMI_LINK_INTRA] = intra_shm ? SHM_ALPHA : LOOMI_MODEL_ALPHA / 2;
    l->beta[LOOMI_LINK_INTRA] = intra_shm ? SHM_BETA : LOOMI_MODEL_BETA / 4;
    l->alpha[LOOMI_LINK_INTER] = LOOMI_MODEL_ALPHA;
    l->beta[LOOMI_LINK_INTER] = LOOMI_MODEL_BETA;
    l->gamma = LOOMI_MODEL_GAMMA;
    l->gamma_copy = LOOMI_MODEL_GAMMA_COPY;
}

loom_result_t loomi_links_read(const char *path, struct loomi_links *l, int rank)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "LOOM_TUNING_FILE %s: %s", path,
                          strerror(errno));
    char line[256];
    int ln = 0;
    loom_result_t r = LOOM_SUCCESS;
    while (r == LOOM_SUCCESS && fgets(line, sizeof line, f)) {
        ln++;
        char *h = strchr(line, '#');
        if (h) *h = '\0';
        char key[64];
        double v;
        int used = 0;
        if (sscanf(line, " %63s%n", key, &used) != 1) continue; /* blank */
        char *end;
        errno = 0;
        v = strtod(line + used, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
        if (errno || end == line + used || *end || !(v >= 0) || v > 1.0) {
            r = loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank,
                           "LOOM_TUNING_FILE %s:%d: '%s' needs one value in seconds (0..1)", path,
                           ln, key);
            break;
        }
        double *dst = NULL;
        int link = -1;
        if (!strcmp(key, "alpha_intra")) dst = &l->alpha[link = LOOMI_LINK_INTRA];
        else if (!strcmp(key, "beta_intra")) dst = &l->beta[link = LOOMI_LINK_INTRA];
        else if (!strcmp(key, "alpha_inter")) dst = &l->alpha[link = LOOMI_LINK_INTER];
        else if (!strcmp(key, "beta_inter")) dst = &l->beta[link = LOOMI_LINK_INTER];
        else if (!strcmp(key, "gamma")) dst = &l->gamma;
        else if (!strcmp(key, "gamma_copy")) dst = &l->gamma_copy;
        else if (!strcmp(key, "chunk_intra")) dst = &l->chunk_cost[LOOMI_LINK_INTRA];
        else if (!strcmp(key, "chunk_inter")) dst = &l->chunk_cost[LOOMI_LINK_INTER];
        if (!dst) {
            r = loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank,
                           "LOOM_TUNING_FILE %s:%d: unknown key '%s' (alpha_intra, beta_intra, "
                           "alpha_inter, beta_inter, gamma, gamma_copy, chunk_intra, "
                           "chunk_inter)",
                           path, ln, key);
            break;
        }
        *dst = v;
        if (link >= 0) l->source[link] = LOOMI_SRC_FILE;
    }
    fclose(f);
    return r;
}

static int fig_ok(double a, double b) { return a >= 0 && a < 1 && b >= 0 && b < 1; }

int loomi_links_valid(const struct loomi_links *l)
{
    for (int k = 0; k < LOOMI_LINKS; k++)
        if (!fig_ok(l->alpha[k], l->beta[k]) || !fig_ok(l->chunk_cost[k], 0) ||
            l->source[k] < 0 || l->source[k] > LOOMI_SRC_TIMED)
            return 0;
    return l->gamma > 0 && l->gamma < 1 && l->gamma_copy > 0 && l->gamma_copy < 1 &&
           l->probe_ms >= 0 && l->probe_ms < 1e6 && (l->intra_shm == 0 || l->intra_shm == 1) &&
           fig_ok(l->verbs_alpha, l->verbs_beta) && fig_ok(l->tcp_alpha, l->tcp_beta) &&
           (l->verbs_compared == 0 || l->verbs_compared == 1) &&
           (l->inter_verbs == 0 || l->inter_verbs == 1) &&
           (l->red_known == 0 || l->red_known == 1) &&
           (!l->red_known || loomi_red_classes_valid(&l->red));
}

static void params(struct loomi_model_params *m, const struct loomi_links *l, int link,
                   double cf, size_t chunk)
{
    m->alpha = l->alpha[link];
    m->beta = l->beta[link];
    m->gamma = l->gamma * cf;
    m->gamma_copy = l->gamma_copy * cf;
    m->chunk_bytes = chunk;
}

/* The latency of k messages posted together within a host: the first
 * pays alpha, each other a quarter of it (the sender's and receiver's
 * overhead; the wire and the wake-up overlap).  Across hosts they do not
 * overlap (see the alltoall in loomi_select_cost).  model.h's port model
 * charges alpha per message, one after the other, which is right for TCP
 * streams but not for windows of concurrent messages. */
static double overlap(double alpha, int k)
{
    return k < 1 ? 0 : alpha * (1 + (k - 1) / 4.0);
}

/* An in-place allreduce that does not save as it goes (all but shared)
 * has the engine copy RECV aside first, to restore it if the operation
 * fails: charged only where shared's window form is weighed in place,
 * which saves as it goes (the copy aside is a large part of the ring's
 * time in place: see perf/NOTES.md, "select.c, the in-place backup"). */
static double backup(int coll, double n, const struct loomi_job_shape *j,
                     const struct loomi_links *l, double cf)
{
    return coll == LOOMI_COLL_ALLREDUCE && j->window == LOOMI_WINDOW_IN ? cf * l->gamma_copy * n
                                                                        : 0;
}

/* Least closed-form time of a flat collective among its algorithms. */
static double best_flat(int coll, int p, size_t bytes, const struct loomi_model_params *m)
{
    double t;
    int a = loomi_model_best(coll, p, bytes, m, &t);
    return a > 0 ? t : -1;
}

/* What a core's own caches hold (L1 and L2: 1-2 MiB on current x86
 * servers); lines written there are slow for another core to read. */
#define PRIVATE_CACHE ((double)(1 << 20))

/* Ranks of a host beyond its cores take turns on them: their own work
 * (reductions, copies) takes cf times as long, and a message between two
 * of them needs both running at once, which costs shared-memory
 * transfers (done by the CPUs) another factor cf.  1: a core each. */
static double core_factor(const struct loomi_job_shape *j)
{
    const struct loomi_hostmap *hm = j->hosts;
    if (!hm || j->cores_per_host <= 0) return 1;
    int most = 0;
    for (int h = 0; h < hm->nhosts; h++)
        if (loomi_host_size(hm, h) > most) most = loomi_host_size(hm, h);
    return most > j->cores_per_host ? (double)most / j->cores_per_host : 1;
}

/* How many ranks take turns on a core: cf, or more where hosts are faked
 * on one machine and share its cores (see shared_intra()). */
static double host_turns(const struct loomi_job_shape *j, double cf)
{
    if (j->machine_ranks > 0 && j->cores_per_host > 0)
        return fmax(cf, (double)j->machine_ranks / j->cores_per_host);
    return cf;
}

double loomi_select_turns(const struct loomi_job_shape *j)
{
    return host_turns(j, core_factor(j));
}

/* Reading lines another core has just written, from its caches, up to
 * PRIVATE_CACHE bytes (the window form's "hot" term in shared_intra()). */
static double hot_lines(const struct loomi_links *l, double bytes)
{
    return l->beta[LOOMI_LINK_INTRA] * fmin(bytes, PRIVATE_CACHE);
}

/* The shared-arena allreduce on one host (shared.c): per round of half an
 * arena, three rounds of zero-byte messages to the L-1 others, a copy in,
 * a reduction of my slice against L-1 peers', a copy out. */
static double shared_intra(int L, double n, const struct loomi_job_shape *j,
                           const struct loomi_links *l, double cf)
{
    double R = (double)j->shared_bytes / 2;
    if (R <= 0) return -1;
    double rounds = ceil(n / R);
    /* Three rounds of zero-byte messages to the L-1 others: posted
     * together, their latencies overlap (see overlap()).  Each waits for
     * every rank of the host, so with cf ranks to a core it waits for
     * their turns on it too: cf times as long (a round of 4 ranks on 2
     * cores took about twice as long as one of 2 ranks that need not
     * wait; the ping-pong that measures alpha involves two ranks only).
     * The turns are counted per machine: hosts faked on one machine take
     * them on the same cores (counted per host, hosts faked in network
     * namespaces chose shared where hierarchical measured faster).  See
     * perf/NOTES.md, "select.c, shared's rounds".  The copies and the
     * reduction cover the n bytes once, whatever the rounds (the
     * last one is partial: charging whole rounds made 2M-3M look dear). */
    const double turns = host_turns(j, cf);
    const double per_round = overlap(l->alpha[LOOMI_LINK_INTRA], L - 1) * turns;
    double sync = 3 * per_round;
    const double f = (L - 1.0) / L;
    if (j->window == LOOMI_WINDOW_IN) {
        /* The window form in place: no push (it would overwrite the
         * peers' inputs before they are read); the reduction saves my
         * slice as it overwrites it, and the copy-out of the others'
         * slices saves what it overwrites: n/L + 2(L-1)/L of n copied.
         * Zero-byte rounds: the descriptors, "red" per round, "out".
         * Both the reduction and the copy-out read lines that their
         * owner has just written, from its core's cache while they are
         * still there: as slow as a transfer within the host, for up to
         * PRIVATE_CACHE bytes (on 2 ranks in place the ring beat shared
         * up to 512K, and shared won from 1M on: perf/NOTES.md,
         * "select.c, windows in place"). */
        sync = (rounds + 2) * per_round;
        double work = cf * (l->gamma_copy * n * (1.0 / L + 2 * f) + l->gamma * n * f);
        double hot = f * hot_lines(l, 2 * n);
        return sync + 1.1 * work + hot;
    }
    if (j->window) {
        /* The window form out of place (shared.c): no copy-in, the
         * reduction reads the peers' inputs in their windows.  On one
         * host the reducer pushes its slice into the others' RECV;
         * otherwise each rank copies the others' slices out of their
         * RECV: either way (L-1)/L of n copied, streamed past
         * LOOM_SHM_STREAM.  Zero-byte rounds: the descriptors once, "red"
         * per round, and "out" once unless pushing.  On 2 ranks it beat
         * the ring at every size measured, 64K to 64M (perf/NOTES.md,
         * "select.c, windows out of place"). */
        const int push = j->hosts && j->hosts->nhosts == 1;
        const double copy = loomi_shared_streams(j->stream_bytes, L, (size_t)n) ? 2.0 / 3 : 1;
        sync = (rounds + (push ? 1 : 2)) * per_round;
        double work = cf * (l->gamma_copy * n * f * copy + l->gamma * n * f);
        return sync + 1.1 * work;
    }
    /* The copy-out with streaming stores (past LOOM_SHM_STREAM) moves two
     * bytes through memory per byte copied where a cached copy moves
     * three (it reads each line before overwriting it): 2/3 of the copy
     * time.  (Streamed was the faster on 2 ranks at 64 MiB: perf/NOTES.md,
     * "select.c, streamed copy-out".) */
    double out = loomi_shared_streams(j->stream_bytes, L, (size_t)n) ? 2.0 / 3 : 1;
    double work = cf * (l->gamma_copy * n * (f + out) + l->gamma * n * f);
    /* The three phases of a round wait for each other (only the next
     * round's copy-in overlaps them): on 2 ranks, whose CPU work equals
     * the ring's, shared measured slower than ring and tree from 512K
     * to 8M, by about a tenth.  A tenth more. */
    work *= 1.1;
    return rounds * sync + work;
}

/* The shared-arena costs below (reduce-scatter, allgather, broadcast)
 * read alike on purpose: one formula per algorithm, each fitted to its
 * own measurements (perf/NOTES.md), rather than one shared with knobs.
 *
 * The shared-arena reduce-scatter on one host (shared.c): n bytes a
 * rank's block; per round a chunk of every block fills half an arena,
 * with two rounds of zero-byte messages ("in", "done"); the copy-in
 * covers (L-1) blocks once and the reduction reads L-1 peers' chunks of
 * mine.  Its phases wait for each other as the allreduce's do (the tenth
 * in shared_intra()). */
static double shared_rs_intra(int L, double n, const struct loomi_job_shape *j,
                              const struct loomi_links *l, double cf)
{
    double C = (double)j->shared_bytes / 2 / L;
    if (C <= 0) return -1;
    const double turns = host_turns(j, cf);
    const double sync = 2 * overlap(l->alpha[LOOMI_LINK_INTRA], L - 1) * turns;
    const double work = cf * (L - 1) * n * (l->gamma_copy + l->gamma);
    /* The reduction reads lines that their writers have just written,
     * from those cores' caches, as the window form's does (see
     * shared_intra()): charged as there where each rank has a core of
     * its own (2 ranks: shared slower than the ring and halving-doubling
     * for blocks from LOOM_SHM_CMA's size, whose transfers are single
     * kernel copies, up to 1M, and faster from 2M).  Where ranks take
     * turns on the cores none showed: 4 ranks on 2 cores, shared fastest
     * from blocks of 32K to 16M.  See perf/NOTES.md, "select.c, shared
     * reduce-scatter". */
    const double hot = turns > 1 ? 0 : hot_lines(l, (L - 1) * n);
    return ceil(n / C) * sync + 1.1 * work + hot;
}

/* The shared-arena allgather on one host (shared.c): n bytes a rank's
 * block, half an arena of it per round with two rounds of zero-byte
 * messages; a copy of the block in, a copy of every block out (the own
 * one from SEND), streamed as the allreduce's copy-out past
 * LOOM_SHM_STREAM (the host's outputs together), and the same penalty
 * for reading lines that peers have just written as the reduce-scatter.
 * With ranks taking turns on the cores it beat recursive doubling past
 * a few MiB in all, and tied at 4 MiB (perf/NOTES.md, "select.c,
 * shared allgather"). */
static double shared_ag_intra(int L, double n, const struct loomi_job_shape *j,
                              const struct loomi_links *l, double cf)
{
    const double R = (double)j->shared_bytes / 2;
    if (R <= 0) return -1;
    const double turns = host_turns(j, cf);
    const double sync = 2 * overlap(l->alpha[LOOMI_LINK_INTRA], L - 1) * turns;
    const double out = loomi_shared_streams(j->stream_bytes, L, (size_t)(n * L)) ? 2.0 / 3 : 1;
    const double work = cf * n * l->gamma_copy * (1 + L * out);
    const double hot = turns > 1 ? 0 : hot_lines(l, (L - 1) * n);
    return ceil(n / R) * sync + 1.1 * work + hot;
}

/* The shared-arena broadcast on one host (shared.c): half an arena per
 * round, a zero-byte message from the root to each rank and one back;
 * the root copies the data into its arena (and its RECV in the same
 * pass), every other rank copies it out, streamed as the allgather's.
 * The root's pass sets the pace while each rank has a core; where they
 * take turns, all the copies share the cores.  With ranks taking turns
 * it beat the flat broadcasts out of place from about 16 MiB on, but
 * not at 4 MiB (perf/NOTES.md, "select.c, shared broadcast"). */
static double shared_bcast_intra(int L, double n, const struct loomi_job_shape *j,
                                 const struct loomi_links *l, double cf)
{
    const double R = (double)j->shared_bytes / 2;
    if (R <= 0) return -1;
    const double turns = host_turns(j, cf);
    /* The root's message to the others overlaps; their answers come as
     * each gets its turn, one after another (charged overlapped, it was
     * chosen at tens of KiB a rank, where the flat ones measured faster:
     * perf/NOTES.md, "select.c, shared broadcast"). */
    const double a = l->alpha[LOOMI_LINK_INTRA];
    const double sync = (overlap(a, L - 1) + a * (L - 1)) * turns;
    const double out = loomi_bcast_streams(j->stream_bytes, L, (size_t)n) ? 2.0 / 3 : 1;
    const double work = l->gamma_copy * n * fmax(1 + out, cf * (1 + L * out) / L);
    const double hot = hot_lines(l, n);
    return ceil(n / R) * sync + 1.1 * work + hot;
}

double loomi_allreduce_reduced(int algo, int p, double n)
{
    int lg = 0;
    while ((2 << lg) <= p) lg++;
    switch (algo) {
    /* Every round reduces the whole vector, the fold-in round of ranks
     * beyond a power of two too. */
    case LOOMI_ALGO_RECURSIVE_DOUBLING: return (lg + ((1 << lg) != p)) * n;
    case LOOMI_ALGO_TREE: return p == 2 ? n / 2 : n;
    default: return (double)(p - 1) / p * n; /* the ring, halving-doubling, shared */
    }
}

/* Through shared memory every byte a rank sends is a copy by its core
 * into a FIFO, and every byte it receives a copy out, or a reduction:
 * CPU work, which the port model's pipelining lets overlap with itself.
 * The least CPU time of a flat allreduce on one host, to weigh it
 * fairly against shared_intra(): ring and halving-doubling send
 * 2(p-1)/p of the vector and reduce half of what they receive,
 * recursive doubling sends and reduces the whole vector per round (its
 * fold-in round of ranks beyond a power of two reduces it too), and
 * reads the input twice, to send it and to reduce it, where the others
 * read it once: a third more memory traffic, which shows on vectors the
 * caches cannot keep (2 ranks, 4M-64M: markedly slower than the ring).
 * The double binary tree: on 2 ranks, the ring's figure (each rank roots
 * half); beyond, a rank sends 2n (up once, down to two children),
 * reduces n and copies n out.
 * A reduce-scatter by the ring or halving-doubling sends (p-1) of its
 * n-byte blocks, a copy into the transport, and copies what it receives
 * out (of a FIFO cell, or of the sender's buffer by the kernel) before
 * it reduces it: against shared_rs_intra()'s one copy, which is why
 * shared wins the large reduce-scatters on one host.
 * A broadcast by the tree or scatter-allgather: each byte a rank
 * receives is copied into a cell by its sender and out by itself, or
 * once by the kernel (LOOM_SHM_CMA), which is no faster: on 2 ranks the
 * tree's broadcast took about two copies' time a byte; without the term
 * the table kept the tree or scatter-allgather at 32M-64M, where shared
 * took far less time.  Figures: perf/NOTES.md, "select.c, flat
 * algorithms' CPU work".
 * 0 for the others: no CPU term. */
static double shm_flat_cpu(int coll, int algo, int p, double n, const struct loomi_links *l,
                           double cf)
{
    const double gc = l->gamma_copy, g = l->gamma, f = (double)(p - 1) / p;
    if (coll == LOOMI_COLL_REDUCE_SCATTER)
        return algo == LOOMI_ALGO_RING || algo == LOOMI_ALGO_HALVING_DOUBLING
                   ? cf * (p - 1) * n * (2 * gc + g)
                   : 0;
    if (coll == LOOMI_COLL_BROADCAST)
        return algo == LOOMI_ALGO_TREE || algo == LOOMI_ALGO_SCATTER_ALLGATHER
                   ? cf * 2 * gc * n
                   : 0;
    if (coll != LOOMI_COLL_ALLREDUCE) return 0;
    const double red = loomi_allreduce_reduced(algo, p, n) * g;
    switch (algo) {
    case LOOMI_ALGO_RING:
    case LOOMI_ALGO_HALVING_DOUBLING: return cf * (f * n * 3 * gc + red);
    case LOOMI_ALGO_RECURSIVE_DOUBLING:
        return cf * (floor(log2((double)p)) * n * gc + red) * 4.0 / 3;
    case LOOMI_ALGO_TREE: return cf * ((p == 2 ? f : 1.0) * n * 3 * gc + red);
    default: return 0;
    }
}

/* The estimate; `chunked`: messages cut into chunks cost what the
 * probe measured a piece of a stream to cost (loomi_select_chunk()). */
static double select_cost(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                          const struct loomi_links *l, int chunked)
{
    const int p = j->nranks;
    const struct loomi_hostmap *hm = j->hosts;
    const int H = hm ? hm->nhosts : p;
    const int uniform = hm ? loomi_hostmap_uniform(hm) : 1;
    const int L = uniform ? p / H : 0;
    const double cf = core_factor(j);
    struct loomi_model_params in, out, flat;
    params(&in, l, LOOMI_LINK_INTRA, cf, j->chunk_bytes);
    params(&out, l, LOOMI_LINK_INTER, cf, j->chunk_bytes);
    in.beta *= cf;
    if (chunked) {
        in.alpha = fmax(in.alpha, l->chunk_cost[LOOMI_LINK_INTRA]);
        out.alpha = fmax(out.alpha, l->chunk_cost[LOOMI_LINK_INTER]);
    }
    /* A flat algorithm over several hosts runs at the pace of its slowest
     * links, which cross hosts; except the recursive ones on hosts that
     * hold consecutive ranks, 2^k of them: log2(L) of their rounds stay
     * inside the host. */
    flat = H > 1 ? out : in;
    if (H > 1 && L > 1 && loomi_hostmap_runs(hm) &&
        (algo == LOOMI_ALGO_RECURSIVE_DOUBLING || algo == LOOMI_ALGO_HALVING_DOUBLING)) {
        /* Partners r xor 2^k: latency by rounds.  Bytes: recursive
         * doubling's allreduce sends the whole vector every round; the
         * others send blocks, and the rounds inside the host are the ones
         * that carry the fewest, L-1 of each rank's p-1 (the halving
         * starts with the farthest partner, the doubling ends with it). */
        double li = log2((double)L), lo = log2((double)H), w = li / (li + lo);
        double wb = coll == LOOMI_COLL_ALLREDUCE && algo == LOOMI_ALGO_RECURSIVE_DOUBLING
                        ? w
                        : (double)(L - 1) / (double)(p - 1);
        flat.alpha = w * in.alpha + (1 - w) * out.alpha;
        /* In their rounds across hosts every rank of a host crosses at
         * once, L of them over the host's link, which the probe timed
         * with one pair alone.  Charged to the reductions, where the
         * unshared figure chose halving-doubling where it was slower
         * than shared (the allreduce) and hierarchical (the
         * reduce-scatter), 2 x 2 over veth.  The allgather's recursive
         * doubling gets less of it: with the whole share its crossover
         * to hierarchical came too low, and with none too high, both
         * moving with the probe's figures from job to job.  Measured
         * (2 x 2 over veth), it lies between 32K and 64K a rank.  Half
         * the share put it there for almost every probe's figures;
         * three quarters put it lower, and far too low for the figures
         * of a host with fast shared memory, where recursive doubling
         * measured faster (test_model.c).  See perf/NOTES.md,
         * "select.c, crossing hosts together". */
        /* With RDMA between the hosts each rank crosses through the NIC
         * the job picture gave it: the ranks of a host share that NIC,
         * not one link (2 x 8 ranks on 4 NICs: 2 to a NIC).  Over TCP
         * they share the host's route. */
        int crossing = L;
        if (j->nics_per_host > 1 && !(l->verbs_compared && !l->inter_verbs))
            crossing = (L + j->nics_per_host - 1) / j->nics_per_host;
        const double share =
            coll == LOOMI_COLL_ALLGATHER ? 1 + 0.5 * (crossing - 1) : crossing;
        flat.beta = wb * in.beta + (1 - wb) * out.beta * share;
    }
    if (H > 1 && L > 1 && coll == LOOMI_COLL_ALLTOALL && algo == LOOMI_ALGO_PAIRWISE) {
        /* Its exchanges run at once; the L-1 inside the host go over the
         * faster link alongside the p-L that cross: the crossing share
         * of the bytes sets the pace. */
        flat.beta = out.beta * (double)(p - L) / (double)(p - 1);
    }
    const double n = (double)bytes;
    if (H > 1 && coll == LOOMI_COLL_ALLTOALL && algo == LOOMI_ALGO_BRUCK && host_turns(j, cf) > 1) {
        /* Ranks that take turns on their cores (hosts faked on one
         * machine, or more ranks than cores): the crossing messages of a
         * round are the cores' work, and a round in which every rank
         * crosses costs `turns` latencies.  In the round at distance d
         * the last d ranks of each host of L consecutive ones cross, and
         * every rank once d >= L.  (2 x 2 ranks on 2 cores, 8 bytes:
         * bruck measured as slow as pairwise, far from what one latency
         * a round made it: perf/NOTES.md, "select.c, the alltoall".) */
        const double turns = host_turns(j, cf);
        double sum = 0;
        int rounds = 0;
        for (int d = 1; d < p; d *= 2, rounds++)
            sum += fmax(1, (loomi_hostmap_runs(hm) && L > 0 ? fmin(1, (double)d / L) : 1) * turns);
        flat.alpha *= sum / rounds;
    }

    if (algo != LOOMI_ALGO_HIERARCHICAL && algo != LOOMI_ALGO_SHARED) {
        if (coll == LOOMI_COLL_ALLTOALL && algo == LOOMI_ALGO_PAIRWISE && p > 1 && H == 1) {
            /* Its p-1 exchanges are posted in windows of 8 at once.
             * Across hosts each message pays its whole alpha: system
             * calls on both sides, and over veth the receiver's network
             * stack on the sender's core (2 x 2 ranks, 8 bytes: slower
             * than hierarchical, whose three messages wait for each
             * other).  That puts the switch to pairwise at 48K a peer.
             * (Charged three quarters of alpha each past the first, it
             * came at 32K, where hierarchical measured faster; at 64K
             * pairwise mostly won.  perf/NOTES.md, "select.c, the
             * alltoall".) */
            int w = p - 1 < 8 ? p - 1 : 8;
            flat.alpha = overlap(flat.alpha, w) / w;
        }
        double t = loomi_model_time(coll, algo, p, bytes, &flat);
        if (t >= 0) t += backup(coll, n, j, l, cf);
        if (t >= 0 && H == 1 && l->intra_shm) {
            /* The copies and the transfers overlap, but not wholly: a
             * twentieth of the lesser shows.  Between algorithms of the
             * same CPU work this prefers the shorter pipeline (on 2
             * ranks at 16 MiB the tree measured faster than the ring). */
            double cpu = shm_flat_cpu(coll, algo, p, n, l, cf);
            if (cpu > 0) t = fmax(t, cpu) + 0.05 * fmin(t, cpu);
        }
        return t;
    }
    /* The hierarchical algorithms need several hosts of several ranks
     * (forced otherwise, they run a flat algorithm). */
    if (!hm || H == p || !uniform || (H == 1 && algo == LOOMI_ALGO_HIERARCHICAL)) return -1;
    double t = -1;
    switch (coll) {
    case LOOMI_COLL_ALLREDUCE: {
        /* The rails allreduce each rank's slice across the hosts: at once
         * in hier.c; in shared.c round by round, half an arena at a time,
         * each round a whole allreduce with its latency. */
        const double R = algo == LOOMI_ALGO_SHARED ? (double)j->shared_bytes / 2 : n;
        if (algo == LOOMI_ALGO_SHARED && R <= 0) return -1; /* no arenas */
        const double nrounds = n > R ? ceil(n / R) : 1;
        const size_t slice = (size_t)ceil((n < R ? n : R) / L);
        double rail = H > 1 ? nrounds * best_flat(LOOMI_COLL_ALLREDUCE, H, slice, &out) : 0;
        if (rail < 0) return -1;
        if (algo == LOOMI_ALGO_SHARED) {
            /* Its rounds pipeline: while one round's slices cross the
             * hosts the next one's are copied in and reduced (two rounds
             * in flight, one per half of the arena), so past the first
             * round the slower of the two stages sets the pace.  (2 x 2
             * over veth, 32M-64M: shared measured faster than
             * hierarchical, which the plain sum of the phases had the
             * other way.) */
            double s = shared_intra(L, n, j, l, cf);
            t = s < 0 ? -1 : (s + rail) / nrounds + (nrounds - 1) / nrounds * fmax(s, rail);
        } else {
            /* Its phases wait for each other, as shared's do (the tenth
             * in shared_intra()), and are separate sub-schedules, whose
             * rails start together: a quarter more in all.  (2 x 2
             * ranks over veth: charged a tenth more, hierarchical was
             * chosen up to 3M, and measured slower than shared from 256K
             * to 2M; perf/NOTES.md, "select.c, hierarchical".) */
            double rs = loomi_model_time(LOOMI_COLL_REDUCE_SCATTER, LOOMI_ALGO_RING, L, slice, &in);
            double ag = loomi_model_time(LOOMI_COLL_ALLGATHER, LOOMI_ALGO_RING, L, slice, &in);
            t = 1.25 * (rs + ag) + rail;
        }
        break;
    }
    case LOOMI_COLL_REDUCE_SCATTER:
        if (algo == LOOMI_ALGO_SHARED) {
            /* Across hosts shared.c runs the hierarchical form. */
            t = H == 1 ? shared_rs_intra(L, n, j, l, cf) : -1;
            break;
        }
        if (algo != LOOMI_ALGO_HIERARCHICAL) return -1;
        /* Hosts of consecutive ranks: H reduce-scatters inside the host,
         * one per host's run of the input, then the rail's: the bytes of
         * one reduce-scatter of H blocks a rank, with the latency of H
         * (charged one latency, 2 x 2 ranks over veth took hierarchical
         * from 1.5K a rank, where halving-doubling measured faster up to
         * 16K).  Other layouts: hier.c first permutes the p
         * blocks into SCRATCH, a copy of the whole input, which the flat
         * algorithms do not make, and reduce-scatters them at once. */
        t = loomi_model_time(LOOMI_COLL_REDUCE_SCATTER, LOOMI_ALGO_RING, L, bytes * (size_t)H,
                             &in) +
            best_flat(LOOMI_COLL_REDUCE_SCATTER, H, bytes, &out) +
            (loomi_hostmap_runs(hm) ? (H - 1) * (L - 1) * in.alpha : n * p * in.gamma_copy);
        break;
    case LOOMI_COLL_ALLGATHER:
        if (algo == LOOMI_ALGO_SHARED) {
            t = H == 1 ? shared_ag_intra(L, n, j, l, cf) : -1;
            break;
        }
        if (algo != LOOMI_ALGO_HIERARCHICAL) return -1;
    {
        /* Hosts of consecutive ranks: the rail swaps the blocks straight
         * into RECV, and H allgathers inside the host spread the H runs,
         * each with its own latency.  The own host's run may go while the
         * rail's messages are in flight, but its copies then compete
         * with the rail's for the core: charged in full.  (Charging the
         * runs as one allgather of H times the bytes, partly hidden
         * behind the rail, had 2 x 2 ranks over veth take hierarchical
         * from 4K, where recursive doubling measured faster up to 64K.)
         * Other layouts: one allgather of all H runs after the rail
         * (hier.c), and a copy of the p blocks into rank order. */
        double rail = best_flat(LOOMI_COLL_ALLGATHER, H, bytes, &out);
        t = loomi_hostmap_runs(hm)
                ? rail + H * loomi_model_time(LOOMI_COLL_ALLGATHER, LOOMI_ALGO_RING, L, bytes, &in)
                : rail +
                      loomi_model_time(LOOMI_COLL_ALLGATHER, LOOMI_ALGO_RING, L,
                                       bytes * (size_t)H, &in) +
                      n * p * in.gamma_copy;
        break;
    }
    case LOOMI_COLL_ALLTOALL:
        if (algo != LOOMI_ALGO_HIERARCHICAL) return -1;
    {
        /* hier.c: blocks for each host cross the network once per host
         * pair (an all-to-all of L*n-byte blocks along each rail) and
         * are redistributed inside the host (as much as an all-to-all of
         * H*n-byte blocks).  On hosts of consecutive ranks, out of place
         * (what the table is for), with no copies, and the own host's
         * run is spread while the rail carries the others; otherwise
         * through three local copies of the whole p*n bytes. */
        double rail = best_flat(LOOMI_COLL_ALLTOALL, H, bytes * (size_t)L, &out);
        /* Where the ranks take turns on their cores, counted per machine
         * (hosts faked on one machine too), the runs' copies take turns
         * with theirs, and only the latencies of the rail and the own run
         * overlap: moving their bytes is the same cores' work.  (2 x 2
         * ranks on 2 cores, 1M a peer: the rail and the own run at once
         * took longer than the two apart added up.  Charged as on cores
         * of their own, the table kept hierarchical up to 128K-1M a
         * peer, where pairwise measured faster from 128K; hierarchical
         * is faster up to 32K.  perf/NOTES.md, "select.c, the
         * alltoall".) */
        const double turns = host_turns(j, cf);
        struct loomi_model_params inr = in;
        if (turns > 1) inr.beta = l->beta[LOOMI_LINK_INTRA] * turns;
        double run = best_flat(LOOMI_COLL_ALLTOALL, L, bytes, &inr); /* one host's run */
        double intra = best_flat(LOOMI_COLL_ALLTOALL, L, bytes * (size_t)H, &inr);
        double first = fmax(rail, run);
        if (turns > 1) {
            const double ra = best_flat(LOOMI_COLL_ALLTOALL, H, 0, &out);
            const double rn = best_flat(LOOMI_COLL_ALLTOALL, L, 0, &inr);
            first = fmax(ra, rn) + (rail - ra) + (run - rn);
        }
        t = loomi_hostmap_runs(hm) ? first + run * (H - 1)
                                   : rail + intra + 3 * n * p * in.gamma_copy;
        break;
    }
    case LOOMI_COLL_BROADCAST:
        if (algo == LOOMI_ALGO_SHARED) {
            t = H == 1 ? shared_bcast_intra(L, n, j, l, cf) : -1;
            break;
        }
        if (algo != LOOMI_ALGO_HIERARCHICAL) return -1;
        t = best_flat(LOOMI_COLL_BROADCAST, H, bytes, &out) +
            best_flat(LOOMI_COLL_BROADCAST, L, bytes, &in);
        break;
    default:
        return -1;
    }
    return t < 0 || algo == LOOMI_ALGO_SHARED ? t : t + backup(coll, n, j, l, cf);
}

double loomi_select_cost(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                         const struct loomi_links *l)
{
    return select_cost(coll, algo, bytes, j, l, 0);
}

/* The algorithm is chosen first, at LOOM_CHUNK_SIZE, as the tables were
 * built and timed before chunks were weighed; then its chunk.  A smaller
 * chunk lets a pipelined algorithm (tree, ring, recursive doubling)
 * overlap its stages, and costs a message per chunk: where that message
 * is dear, the estimate keeps the large ones.  The gain must clear
 * LOOMI_CHUNK_GAIN: chunks the model finds about as good stay as they
 * were.  The shared and hierarchical algorithms pipeline by arena rounds
 * and pieces of their own, which the model does not tie to the chunk.
 * Only across hosts, where a NIC moves the bytes while the cores reduce,
 * and only where each rank has a core of its own.  Within a host the
 * cores make the transfers, as copies, and smaller chunks never paid
 * where measured (2 ranks: the ring in the model's 64K or 128K chunks
 * was slower than in 2M ones); below LOOM_SHM_CMA a chunk is two copies
 * instead of one.  Where ranks take turns, the cores that move a chunk
 * are the ones that reduce the next: 2 hosts of 2 ranks faked on 2
 * cores, with TCP between them, ran the ring's allreduce no faster in
 * the chunks that the model picked than in 2M ones.  See perf/NOTES.md,
 * "select.c, chunks". */
size_t loomi_select_chunk(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                          const struct loomi_links *l)
{
    if (j->chunk_fixed || !j->chunk_bytes || algo == LOOMI_ALGO_HIERARCHICAL ||
        algo == LOOMI_ALGO_SHARED || bytes <= LOOMI_CHUNK_MIN ||
        (j->hosts ? j->hosts->nhosts : j->nranks) < 2 || host_turns(j, core_factor(j)) > 1)
        return 0;
    struct loomi_job_shape jc = *j;
    const double base = select_cost(coll, algo, bytes, &jc, l, 1);
    if (!(base > 0)) return 0;
    size_t best = 0;
    double bt = base * (1 - LOOMI_CHUNK_GAIN);
    /* Largest first: of two chunks that tie, the one with fewer steps. */
    for (size_t c = LOOMI_CHUNK_MAX; c >= LOOMI_CHUNK_MIN; c /= 2) {
        if (c == j->chunk_bytes) continue;
        jc.chunk_bytes = c;
        const double t = select_cost(coll, algo, bytes, &jc, l, 1);
        if (t >= 0 && t < bt) {
            best = c;
            bt = t;
        }
    }
    return best;
}

/* Across hosts, a hierarchical or shared algorithm runs its phases as
 * separate sub-schedules, with local copies between them and more steps
 * for the engine than the model counts: it is taken only where it beats
 * the best flat algorithm by this factor.  Where the two estimates tie
 * (allgather of a few bytes on 2 x 2 ranks: both cost one message inside
 * and one across), the flat one measured faster, by about the margin
 * below or more.  (On one host
 * `shared` is a single schedule, and no margin applies.) */
#define PHASED_MARGIN 0.9

static int phased(int algo, const struct loomi_job_shape *j)
{
    return (algo == LOOMI_ALGO_HIERARCHICAL || algo == LOOMI_ALGO_SHARED) && j->hosts &&
           j->hosts->nhosts > 1;
}

/* Estimates this close are a tie: which one comes out lower is rounding
 * (on 2 ranks the ring's and halving-doubling's reduce-scatter are the
 * same exchange).  A tie keeps `prev`, the choice at the size before, so
 * that a table does not flip between two algorithms that cost the same;
 * else it goes to the lower enum value. */
#define TIE 1e-9

/* Near-ties.  Around a crossover the two estimates are close, and which
 * algorithm runs faster there is decided by what the model has least
 * hold of: a probe's alpha or beta off by its noise, the cores the other
 * jobs of the machine take, the caches.  Measured, such pairs swap
 * places from one job to the next.  Where another algorithm's estimate
 * is within LOOMI_TIE_NEAR (10%) of the least, the model cannot tell
 * them apart (its error at the crossovers measured is larger than
 * that), and either one costs at most that much by the model's own
 * account: so among them the one with the better worst case is chosen,
 * its estimate under the pessimistic figures of loomi_select_worst() —
 * alpha doubled (a message's cost is what the probe measures worst and
 * what oversubscribed cores raise most), beta doubled (another job's
 * traffic), or half the cores (ranks that take turns on them: copies
 * and reductions slower) — the largest of the three.  The least
 * estimate keeps its place unless the other's worst case is better by
 * more than WORSE (1%: closer, the estimates say nothing either way,
 * and such a near-tie goes unmarked).  The figures are the links that every rank has from
 * rank 0 and the job's shape, which every rank has alike: every rank
 * builds the same table, ties and all.  Two algorithms whose estimates
 * are equal (within TIE) run the same exchange and are no near-tie.
 * Measured, noisily, on 2 x 2 ranks: perf/NOTES.md, "select.c,
 * near-ties". */
#define WORSE 0.01

double loomi_select_worst(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                          const struct loomi_links *l)
{
    double w = loomi_select_cost(coll, algo, bytes, j, l);
    if (w < 0) return w;
    struct loomi_links x = *l;
    for (int k = 0; k < LOOMI_LINKS; k++) {
        x.alpha[k] *= 2;
        x.chunk_cost[k] *= 2;
    }
    w = fmax(w, loomi_select_cost(coll, algo, bytes, j, &x));
    x = *l;
    for (int k = 0; k < LOOMI_LINKS; k++) x.beta[k] *= 2;
    w = fmax(w, loomi_select_cost(coll, algo, bytes, j, &x));
    /* Half the cores: the fewest of a host halved (where unknown, the
     * most ranks of a host, a core each, halved); on one core, twice the
     * ranks on the machine. */
    struct loomi_job_shape jh = *j;
    int most = 1;
    if (j->hosts)
        for (int h = 0; h < j->hosts->nhosts; h++)
            if (loomi_host_size(j->hosts, h) > most) most = loomi_host_size(j->hosts, h);
    const int cores = j->cores_per_host > 0 ? j->cores_per_host : most;
    jh.cores_per_host = cores > 1 ? cores / 2 : 1;
    if (cores <= 1) jh.machine_ranks = 2 * (j->machine_ranks > most ? j->machine_ranks : most);
    w = fmax(w, loomi_select_cost(coll, algo, bytes, &jh, l));
    return w;
}

/* The choice at `bytes`; where it was a near-tie, *tie says with what
 * (tie->chosen 0: none).  tie NULL: the least estimate, no near-ties
 * (the tables that loom-info cannot mark: the windows' and the slower
 * reductions' allreduce). */
static int best_algo(int coll, size_t bytes, const struct loomi_job_shape *j,
                     const struct loomi_links *l, int prev, struct loomi_tie *tie)
{
    int best = LOOMI_ALGO_AUTO;
    double bt = 0, tprev = -1;
    double ta[LOOMI_NUM_ALGOS];
    if (tie) memset(tie, 0, sizeof *tie);
    /* Compare each with its handicap: phased ones at cost / margin. */
    for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
        ta[a] = -1;
        if (!loomi_algo_gen(coll, a)) continue;
        double t = loomi_select_cost(coll, a, bytes, j, l);
        if (t < 0) continue;
        if (phased(a, j)) t /= PHASED_MARGIN;
        ta[a] = t;
        if (a == prev) tprev = t;
        if (best == LOOMI_ALGO_AUTO || t < bt * (1 - TIE)) {
            best = a;
            bt = t;
        }
    }
    if (tprev >= 0 && tprev <= bt * (1 + TIE)) {
        best = prev;
        bt = tprev;
    }
    if (best == LOOMI_ALGO_AUTO || !tie) return best;
    /* Near-ties: the better worst case among those within LOOMI_TIE_NEAR. */
    int pick = best, near = 0;
    double wa[LOOMI_NUM_ALGOS], wpick = 0;
    for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
        if (a == best || ta[a] < 0 || ta[a] > bt * (1 + LOOMI_TIE_NEAR) ||
            ta[a] <= bt * (1 + TIE))
            continue;
        if (!near) {
            wa[best] = loomi_select_worst(coll, best, bytes, j, l);
            if (phased(best, j)) wa[best] /= PHASED_MARGIN;
            wpick = wa[best];
        }
        wa[a] = loomi_select_worst(coll, a, bytes, j, l);
        if (phased(a, j)) wa[a] /= PHASED_MARGIN;
        /* The nearest, for the record where the least estimate stays. */
        if (!near || ta[a] < ta[near]) near = a;
        if (wa[a] < wpick * (1 - WORSE)) {
            pick = a;
            wpick = wa[a];
        }
    }
    if (!near) return best;
    const int other = pick != best ? best : near;
    /* Worst cases as close as WORSE give nothing to choose on: no mark. */
    if (pick == best && wa[other] > 0 && wa[pick] > wa[other] * (1 - WORSE)) return best;
    tie->chosen = pick;
    tie->other = other;
    tie->ratio = ta[pick] / ta[other];
    tie->worst = wa[other] > 0 ? wa[pick] / wa[other] : 1;
    return pick;
}

/* Append "from this size on, algo in chunks of `chunk`" unless the last
 * range already says so (the first range starts at 0); -1 when the
 * table is full. */
static int push_range(struct loomi_ranges *t, size_t from, int algo, size_t chunk)
{
    if (t->n && t->r[t->n - 1].algo == algo && t->r[t->n - 1].chunk == chunk) return 0;
    if (t->n == LOOMI_SELECT_MAX_RANGES) return -1;
    t->r[t->n].from = t->n ? from : 0;
    t->r[t->n].chunk = chunk;
    t->r[t->n++].algo = algo;
    return 0;
}

/* One collective's ranges, over 1 B .. 1 GiB at powers of two and the
 * points halfway between. */
static size_t table_size(int k)
{
    return k % 2 ? (size_t)3 << (k / 2 - 1) : (size_t)1 << (k / 2);
}

/* Record the near-tie at `bytes` (the sizes up to `to`, 0: no end),
 * joined to the one before where it goes on with the same pair. */
static void note_tie(struct loomi_ties *ts, const struct loomi_tie *tie, size_t bytes, size_t to)
{
    struct loomi_tie *e = ts->n ? &ts->t[ts->n - 1] : NULL;
    if (e && e->to == bytes && e->chosen == tie->chosen && e->other == tie->other) {
        e->to = to;
        e->ratio = fmax(e->ratio, tie->ratio);
        e->worst = fmax(e->worst, tie->worst);
        return;
    }
    if (ts->n == LOOMI_SELECT_MAX_TIES) return;
    e = &ts->t[ts->n++];
    *e = *tie;
    e->from = bytes;
    e->to = to;
}

/* One collective's ranges, over 1 B .. 1 GiB at powers of two and the
 * points halfway between; its near-ties into ts (NULL: not kept). */
static void build_ranges(struct loomi_ranges *t, struct loomi_ties *ts, int c,
                         const struct loomi_job_shape *j, const struct loomi_links *l)
{
    t->n = 0;
    if (ts) ts->n = 0;
    for (int k = 0; k <= 60; k++) {
        if (k == 1) continue; /* 1.5 B */
        const size_t bytes = table_size(k);
        struct loomi_tie tie = {0};
        int a = best_algo(c, bytes, j, l, t->n ? t->r[t->n - 1].algo : LOOMI_ALGO_AUTO,
                          ts ? &tie : NULL);
        if (a == LOOMI_ALGO_AUTO) a = loomi_algo_default(c, j->nranks, bytes);
        if (push_range(t, bytes, a, loomi_select_chunk(c, a, bytes, j, l))) break;
        if (ts && tie.chosen && tie.chosen == a)
            note_tie(ts, &tie, bytes, k == 0 ? 2 : k < 60 ? table_size(k + 1) : 0);
    }
}

void loomi_select_build(struct loomi_selection *sel, const struct loomi_job_shape *j,
                        const struct loomi_links *l)
{
    memset(sel, 0, sizeof *sel);
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) build_ranges(&sel->coll[c], &sel->ties[c], c, j, l);
    for (int k = 0; k < LOOMI_RED_CLASSES; k++)
        sel->allreduce_red[k] = sel->coll[LOOMI_COLL_ALLREDUCE];
    struct loomi_job_shape jw = *j;
    for (int ip = 0; ip < 2; ip++) {
        jw.window = ip ? LOOMI_WINDOW_IN : LOOMI_WINDOW_OUT;
        build_ranges(&sel->window[ip], NULL, LOOMI_COLL_ALLREDUCE, &jw, l);
    }
}

double loomi_select_fit_beta(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                             const struct loomi_links *l, double took, double margin)
{
    struct loomi_links x = *l;
    const double b0 = l->beta[LOOMI_LINK_INTRA];
    const double model = loomi_select_cost(coll, algo, bytes, j, &x);
    if (!(b0 > 0) || !(model > 0) || took <= margin * model) return 0;
    /* The estimate grows with beta: bisect, up to 8 times the probe's. */
    double lo = b0, hi = 8 * b0;
    x.beta[LOOMI_LINK_INTRA] = hi;
    if (loomi_select_cost(coll, algo, bytes, j, &x) < took) return hi;
    for (int it = 0; it < 30; it++) {
        x.beta[LOOMI_LINK_INTRA] = (lo + hi) / 2;
        if (loomi_select_cost(coll, algo, bytes, j, &x) < took) lo = x.beta[LOOMI_LINK_INTRA];
        else hi = x.beta[LOOMI_LINK_INTRA];
    }
    return hi;
}

const struct loomi_range *loomi_ranges_find(const struct loomi_ranges *t, size_t bytes)
{
    const struct loomi_range *e = NULL;
    for (int i = 0; i < t->n && t->r[i].from <= bytes; i++) e = &t->r[i];
    return e;
}

int loomi_ranges_algo(const struct loomi_ranges *t, size_t bytes)
{
    const struct loomi_range *e = loomi_ranges_find(t, bytes);
    return e ? e->algo : LOOMI_ALGO_AUTO;
}

int loomi_select_lookup(const struct loomi_selection *sel, int coll, size_t bytes)
{
    return loomi_ranges_algo(&sel->coll[coll], bytes);
}

void loomi_select_build_red(struct loomi_selection *sel, const struct loomi_job_shape *j,
                            const struct loomi_links *l, const double excess[LOOMI_RED_CLASSES])
{
    for (int q = 1; q < LOOMI_RED_CLASSES; q++) {
        if (!(excess[q] > 0)) continue;
        struct loomi_links lq = *l;
        lq.gamma += excess[q] * 1e-9;
        build_ranges(&sel->allreduce_red[q], NULL, LOOMI_COLL_ALLREDUCE, j, &lq);
    }
}

int loomi_ranges_set(struct loomi_ranges *t, size_t from, size_t to, int algo)
{
    if (to && to <= from) return 0;
    struct loomi_ranges o;
    o.n = 0;
    int bad = 0;
    /* The old ranges up to `from`, then `algo`, then from `to` on the
     * old ranges again. */
    for (int i = 0; i < t->n && t->r[i].from < from; i++)
        bad |= push_range(&o, t->r[i].from, t->r[i].algo, t->r[i].chunk);
    bad |= push_range(&o, from, algo, 0);
    if (to) {
        const struct loomi_range *e = loomi_ranges_find(t, to);
        if (e) bad |= push_range(&o, to, e->algo, e->chunk);
        for (int i = 0; i < t->n; i++)
            if (t->r[i].from > to)
                bad |= push_range(&o, t->r[i].from, t->r[i].algo, t->r[i].chunk);
    }
    if (bad) return -1;
    *t = o;
    return 0;
}

static const char *size_str(size_t b, char *buf, size_t n)
{
    if (b >= ((size_t)1 << 30) && b % ((size_t)1 << 30) == 0) snprintf(buf, n, "%zuG", b >> 30);
    else if (b >= ((size_t)1 << 20) && b % ((size_t)1 << 20) == 0) snprintf(buf, n, "%zuM", b >> 20);
    else if (b >= 1024 && b % 1024 == 0) snprintf(buf, n, "%zuK", b >> 10);
    else snprintf(buf, n, "%zu", b);
    return buf;
}

void loomi_ranges_format(char *buf, size_t n, const struct loomi_ranges *t)
{
    char b[32], b2[32];
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < t->n && used < n; i++) {
        b2[0] = 0;
        if (t->r[i].chunk)
            snprintf(b2, sizeof b2, " (chunks of %s)", size_str(t->r[i].chunk, b, sizeof b));
        int w = snprintf(buf + used, n - used, "%s%s from %s%s", i ? ", " : "",
                         loomi_algo_name(t->r[i].algo), size_str(t->r[i].from, b, sizeof b), b2);
        if (w < 0) break;
        used += (size_t)w;
    }
}

static void print_ranges(FILE *f, const char *label, const struct loomi_ranges *t)
{
    char line[LOOMI_SELECT_MAX_RANGES * 64];
    loomi_ranges_format(line, sizeof line, t);
    fprintf(f, "  %-15s%s\n", label, line);
}

void loomi_select_untie(struct loomi_selection *sel, int coll, size_t from, size_t to)
{
    if (coll < 0 || coll >= LOOMI_NUM_COLLS) return;
    struct loomi_ties *ts = &sel->ties[coll];
    int n = 0;
    for (int i = 0; i < ts->n; i++) {
        const struct loomi_tie *e = &ts->t[i];
        const int overlaps = (!to || e->from < to) && (!e->to || e->to > from);
        if (!overlaps) ts->t[n++] = *e;
    }
    ts->n = n;
}

void loomi_tie_format(char *buf, size_t n, const struct loomi_tie *t)
{
    char b[32], b2[32];
    if (t->to) size_str(t->to, b2, sizeof b2);
    snprintf(buf, n, "from %s%s%s: tie: %s %.2fx %s; chose %s, worst case %.2fx",
             size_str(t->from, b, sizeof b), t->to ? " to " : " on", t->to ? b2 : "",
             loomi_algo_name(t->chosen), t->ratio, loomi_algo_name(t->other),
             loomi_algo_name(t->chosen), t->worst);
}

void loomi_select_print(FILE *f, const struct loomi_selection *sel)
{
    char line[160];
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) {
        print_ranges(f, loomi_coll_name(c), &sel->coll[c]);
        for (int i = 0; i < sel->ties[c].n; i++) {
            loomi_tie_format(line, sizeof line, &sel->ties[c].t[i]);
            fprintf(f, "    %s\n", line);
        }
    }
}

void loomi_select_print_red(FILE *f, const struct loomi_selection *sel, int cls)
{
    if (cls > 0 && cls < LOOMI_RED_CLASSES) print_ranges(f, "  its table", &sel->allreduce_red[cls]);
}

void loomi_select_print_window(FILE *f, const struct loomi_selection *sel)
{
    print_ranges(f, loomi_coll_name(LOOMI_COLL_ALLREDUCE), &sel->window[0]);
    print_ranges(f, "  in place", &sel->window[1]);
}

void loomi_links_print(FILE *f, const struct loomi_links *l)
{
    static const char *const src[] = {"default", "measured", "tuning file",
                                      "measured, raised to the allreduce timed at init"};
    fprintf(f, "  within a host (%s): alpha %.2f us, beta %.3f ns/B (%.2f GB/s) [%s]\n",
            l->intra_shm ? "shm" : "tcp", l->alpha[0] * 1e6, l->beta[0] * 1e9,
            l->beta[0] > 0 ? 1e-9 / l->beta[0] : 0, src[l->source[0]]);
    fprintf(f, "  between hosts (%s):%s alpha %.2f us, beta %.3f ns/B (%.2f GB/s) [%s]\n",
            l->verbs_compared && l->inter_verbs ? "verbs" : "tcp",
            l->verbs_compared && l->inter_verbs ? "" : "  ", l->alpha[1] * 1e6, l->beta[1] * 1e9,
            l->beta[1] > 0 ? 1e-9 / l->beta[1] : 0, src[l->source[1]]);
    if (l->verbs_compared)
        fprintf(f,
                "  verbs against tcp between hosts: verbs alpha %.2f us, %.2f GB/s; tcp alpha "
                "%.2f us, %.2f GB/s; %s is faster at %zu KiB and carries the data\n",
                l->verbs_alpha * 1e6, l->verbs_beta > 0 ? 1e-9 / l->verbs_beta : 0,
                l->tcp_alpha * 1e6, l->tcp_beta > 0 ? 1e-9 / l->tcp_beta : 0,
                l->inter_verbs ? "verbs" : "tcp", LOOMI_VERBS_COMPARE_BYTES >> 10);
    fprintf(f, "  a chunk more costs %.2f us within a host, %.2f us between hosts%s\n",
            l->chunk_cost[0] * 1e6, l->chunk_cost[1] * 1e6,
            l->chunk_cost[0] > 0 || l->chunk_cost[1] > 0 ? "" : " (unknown: alpha stands for it)");
    fprintf(f, "  reduction gamma %.3f ns/B, copy %.3f ns/B; probing took %.1f ms\n",
            l->gamma * 1e9, l->gamma_copy * 1e9, l->probe_ms);
}

void loomi_select_explain(FILE *f, int coll, const struct loomi_job_shape *j,
                          const struct loomi_links *l)
{
    static const size_t sizes[] = {8, 1024, 8192, 65536, 524288, (size_t)4 << 20, (size_t)32 << 20};
    char b[32];
    fprintf(f, "  %-15s", loomi_coll_name(coll));
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        fprintf(f, " %9s", size_str(sizes[k], b, sizeof b));
    fprintf(f, "   (estimated us; bytes as the collective's count takes them)\n");
    for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
        if (!loomi_algo_gen(coll, a)) continue;
        fprintf(f, "    %-13s", loomi_algo_name(a));
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            double t = loomi_select_cost(coll, a, sizes[k], j, l);
            if (t < 0) fprintf(f, " %9s", "-");
            else fprintf(f, " %9.1f", t * 1e6);
        }
        fprintf(f, "\n");
    }
}
