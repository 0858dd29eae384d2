/*
 * select.h - link parameters and the cost model's choice of algorithm.
 *
 * At init every communicator learns what its links cost (measured by a
 * short ping-pong between one pair of ranks per link class, or read from
 * LOOM_TUNING_FILE) and what a reduction costs on its CPUs; rank 0's
 * figures are broadcast so that every rank builds the same table.  From
 * them, the hostmap and the cores per host, the cost model (model.h's
 * closed forms, composed for the hierarchical algorithms) gives each
 * collective the algorithm with the least estimated time at every size;
 * the table is cut into ranges "from this size on, this algorithm".
 */
#ifndef LOOMI_SELECT_H
#define LOOMI_SELECT_H

#include <stddef.h>
#include <stdio.h>

#include "coll/coll.h"
#include "core/hostmap.h"

enum { LOOMI_LINK_INTRA = 0, LOOMI_LINK_INTER = 1, LOOMI_LINKS = 2 };
/* LOOMI_SRC_TIMED: the probe's figure, raised to what the allreduce's
 * timing at init measured (tune.c). */
enum { LOOMI_SRC_DEFAULT = 0, LOOMI_SRC_MEASURED = 1, LOOMI_SRC_FILE = 2, LOOMI_SRC_TIMED = 3 };

struct loomi_links {
    double alpha[LOOMI_LINKS]; /* seconds per message */
    double beta[LOOMI_LINKS];  /* seconds per byte */
    int source[LOOMI_LINKS];   /* LOOMI_SRC_* */
    int intra_shm;             /* ranks of a host talk through shared memory */
    double gamma, gamma_copy;  /* seconds per byte reduced / copied, one core */
    double probe_ms;           /* how long measuring took */
    /* Between hosts, where both RDMA verbs and TCP reach the peers, the
     * probe measures both and the faster carries the data. */
    int verbs_compared;        /* 1: both were measured */
    int inter_verbs;           /* 1: verbs carry the inter-host data */
    double verbs_alpha, verbs_beta, tcp_alpha, tcp_beta;
    /* What each more message costs when a transfer is cut into several
     * (seconds; the probe's stream of pieces against one message of the
     * same bytes): the price of a chunk, against which the model weighs
     * what a smaller chunk pipelines.  0: unknown, alpha stands for it. */
    double chunk_cost[LOOMI_LINKS];
    /* The classes of reductions (redclass.c), once timed: a communicator
     * made from this one inherits them with the links. */
    int red_known;
    struct loomi_red_classes red;
};

/* The message size at which the probe compares verbs with TCP: large
 * enough that bandwidth decides, as it does for the collectives that
 * move data. */
#define LOOMI_VERBS_COMPARE_BYTES ((size_t)1 << 20)

/* Built-in figures where nothing was measured: shared memory on one
 * host, TCP between hosts (model.h's defaults). */
void loomi_links_defaults(struct loomi_links *l, int intra_shm);

/* Read "key value" lines (alpha_intra, beta_intra, alpha_inter,
 * beta_inter in seconds, gamma, gamma_copy in seconds per byte; '#'
 * comments) over the defaults.  Errors name the file and line. */
loom_result_t loomi_links_read(const char *path, struct loomi_links *l, int rank);
/* Whether figures that came over the network are in range (1) before use. */
int loomi_links_valid(const struct loomi_links *l);

enum { LOOMI_WINDOW_OUT = 1, LOOMI_WINDOW_IN = 2 };

/* What the model needs of the job besides the links. */
struct loomi_job_shape {
    const struct loomi_hostmap *hosts; /* NULL: one rank per host */
    int nranks;
    int cores_per_host;  /* fewest cores of any host (contention), 0 unknown */
    /* Most ranks on one machine: hosts faked on one machine (network
     * namespaces, LOOM_HOSTNAME) share its cores; 0 unknown. */
    int machine_ranks;
    /* Fewest NICs that the ranks of a host opened for RDMA (each its own,
     * as the job picture gives it); 0: some rank opened none. */
    int nics_per_host;
    size_t shared_bytes; /* arena per rank, 0 none */
    size_t stream_bytes; /* LOOM_SHM_STREAM (loomi_coll_args) */
    size_t chunk_bytes;  /* LOOM_CHUNK_SIZE: the chunk where the table names none */
    int chunk_fixed;     /* 1: LOOM_CHUNK_SIZE was set; the tables name no chunks */
    /* The allreduce's buffers: plain (0), or in loom_mem_alloc windows
     * that the host's ranks share (the shared algorithm's window form),
     * out of place (LOOMI_WINDOW_OUT) or in place (LOOMI_WINDOW_IN). */
    int window;
};

/* How many ranks take turns on a core of the busiest machine (1: a core
 * each): what their own work, a reduction or a copy, is slowed by. */
double loomi_select_turns(const struct loomi_job_shape *j);

/* Bytes the allreduce's `algo` reduces on its busiest rank, for n bytes
 * on p ranks: what a slower reduction adds to its time (tune.c), and
 * the reductions of its CPU bound on one host. */
double loomi_allreduce_reduced(int algo, int p, double n);

/* The intra-host beta at which the estimate of `algo` at `bytes` on one
 * host equals `took` (seconds), where `took` exceeds the estimate with
 * l's beta by more than `margin` times; else 0.  Never lower than l's:
 * the model's other terms were calibrated against the probe as it
 * measures in the common case (tune.c says when it does not). */
double loomi_select_fit_beta(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                             const struct loomi_links *l, double took, double margin);
/* Estimated seconds of (coll, algo) for `bytes` (model.h's meaning);
 * negative when the algorithm does not apply to this job. */
double loomi_select_cost(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                         const struct loomi_links *l);

#define LOOMI_SELECT_MAX_RANGES 32
/* One collective's choice: algorithm r[i].algo from r[i].from bytes on,
 * cut into chunks of r[i].chunk bytes (0: LOOM_CHUNK_SIZE). */
struct loomi_range {
    size_t from; /* bytes */
    int algo;
    size_t chunk;
};
struct loomi_ranges {
    int n;
    struct loomi_range r[LOOMI_SELECT_MAX_RANGES];
};
/* The chunk sizes the model weighs besides LOOM_CHUNK_SIZE: powers of
 * two from LOOMI_CHUNK_MIN to LOOMI_CHUNK_MAX. */
#define LOOMI_CHUNK_MIN ((size_t)64 << 10)
#define LOOMI_CHUNK_MAX ((size_t)16 << 20)
/* Near-ties (select.c, "near-ties"): sizes from..to-1 (to 0: no end)
 * where the model put `other` within LOOMI_TIE_NEAR of `chosen` and the
 * choice went to the one whose worst case is better.  ratio: chosen's
 * estimate over other's (above 1: chosen is estimated slower), worst:
 * the same under the pessimistic figures; the largest over the span. */
#define LOOMI_TIE_NEAR 0.10
#define LOOMI_SELECT_MAX_TIES 16
struct loomi_tie {
    size_t from, to;
    int chosen, other;
    double ratio, worst;
};
struct loomi_ties {
    int n;
    struct loomi_tie t[LOOMI_SELECT_MAX_TIES];
};
struct loomi_selection {
    struct loomi_ranges coll[LOOMI_NUM_COLLS];
    /* The near-ties of coll[]'s tables. */
    struct loomi_ties ties[LOOMI_NUM_COLLS];
    /* Allreduce with its buffers in windows: [0] out of place, [1] in
     * place (job_shape's window LOOMI_WINDOW_OUT, LOOMI_WINDOW_IN). */
    struct loomi_ranges window[2];
    /* The allreduce's tables for the slower classes of reductions, 1 to
     * LOOMI_RED_CLASSES-1 (comm.h; class 0 takes coll[]): the model's,
     * and each with the spans that the timing at init (tune.c) gave it. */
    struct loomi_ranges allreduce_red[LOOMI_RED_CLASSES];
};

/* The table over sizes 1 B .. 1 GiB (powers of two and midpoints). */
void loomi_select_build(struct loomi_selection *sel, const struct loomi_job_shape *j,
                        const struct loomi_links *l);
/* The table's algorithm for coll at `bytes`. */
int loomi_select_lookup(const struct loomi_selection *sel, int coll, size_t bytes);
/* The range of table t that holds `bytes` (NULL: t is empty). */
const struct loomi_range *loomi_ranges_find(const struct loomi_ranges *t, size_t bytes);
/* Its algorithm (LOOMI_ALGO_AUTO: t is empty). */
int loomi_ranges_algo(const struct loomi_ranges *t, size_t bytes);
/* The chunk the model picks for (coll, algo) at `bytes`: a size from
 * LOOMI_CHUNK_MIN to LOOMI_CHUNK_MAX whose estimate beats j->chunk_bytes'
 * by LOOMI_CHUNK_GAIN, or 0 (keep j->chunk_bytes). */
size_t loomi_select_chunk(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                          const struct loomi_links *l);
#define LOOMI_CHUNK_GAIN 0.1
/* The allreduce's tables of the slower classes (allreduce_red), with
 * reductions dearer by excess[q] ns/B (comm.h's red.excess). */
void loomi_select_build_red(struct loomi_selection *sel, const struct loomi_job_shape *j,
                            const struct loomi_links *l, const double excess[LOOMI_RED_CLASSES]);
/* `algo` (with LOOM_CHUNK_SIZE) for sizes from..to-1 (to 0: no end),
 * the rest as it was;
 * -1, with t unchanged, where that takes more than
 * LOOMI_SELECT_MAX_RANGES ranges. */
int loomi_ranges_set(struct loomi_ranges *t, size_t from, size_t to, int algo);
/* The estimate of (coll, algo) at `bytes` under the pessimistic figures
 * (select.c, "near-ties"): the largest of its estimates with alpha
 * doubled, with beta doubled, and with half the cores. */
double loomi_select_worst(int coll, int algo, size_t bytes, const struct loomi_job_shape *j,
                          const struct loomi_links *l);
/* Drop the near-ties of coll that overlap sizes from..to-1 (the timing at
 * init replaced the choice there). */
void loomi_select_untie(struct loomi_selection *sel, int coll, size_t from, size_t to);
/* "tie: ring 1.04x recursive_doubling; chose ring, worst case 0.80x" for
 * tie t into buf, cut at n. */
void loomi_tie_format(char *buf, size_t n, const struct loomi_tie *t);
/* "ring from 0, shared from 256K (chunks of 1M)" into buf, cut at n. */
void loomi_ranges_format(char *buf, size_t n, const struct loomi_ranges *t);
void loomi_select_print(FILE *f, const struct loomi_selection *sel);
/* The allreduce's table for reductions of class cls. */
void loomi_select_print_red(FILE *f, const struct loomi_selection *sel, int cls);
/* The allreduce's window tables, out of place and in place. */
void loomi_select_print_window(FILE *f, const struct loomi_selection *sel);
void loomi_links_print(FILE *f, const struct loomi_links *l);

/* probe.c: measure the links of a communicator that is connected (init
 * time, collective over the communicator), or read LOOM_TUNING_FILE, and
 * build its selection table. */
struct loom_comm;
loom_result_t loomi_comm_tune(struct loom_comm *c, const struct loomi_links *known);
/* The shape of a connected communicator's job. */
void loomi_comm_shape(const struct loom_comm *c, struct loomi_job_shape *j);
/* The estimated time of every algorithm of coll at a few sizes. */
void loomi_select_explain(FILE *f, int coll, const struct loomi_job_shape *j,
                          const struct loomi_links *l);

#endif
