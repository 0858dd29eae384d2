/*
 * coll.h - algorithms: each writes a schedule, none touches a socket.
 *
 * A generator fills one rank's schedule (s->rank, s->nranks, s->dtype,
 * s->op and s->esize are set by loomi_sched_init) for the collective
 * described by `a`, and sets s->buf_bytes[] to the extent it uses of each
 * buffer.  The same generator output runs on every transport, in the sim
 * transport, in the validator and in the timing model.
 *
 * Buffers, per collective (counts in elements, "es" = s->esize):
 *
 *   allreduce       SEND count, RECV count.  In place: SEND unused (0
 *                   bytes), RECV holds the input.
 *   reduce_scatter  SEND p*count, RECV count (a->count is recvcount).
 *                   In place: RECV aliases SEND block `rank`; generators
 *                   may write RECV only when nothing more reads that
 *                   block of SEND.
 *   allgather       SEND count, RECV p*count (a->count is sendcount).
 *                   In place: SEND unused, own block already in RECV.
 *   alltoall        SEND p*count, RECV p*count.  In place: SEND unused,
 *                   RECV holds the input (generators stage through
 *                   SCRATCH).
 *   alltoallv       SEND/RECV extents from a->counts/displs (send side)
 *                   and a->rcounts/rdispls; never in place.
 *   broadcast       RECV count on every rank; SEND count on root only
 *                   (0 elsewhere).  In place (root): SEND unused.
 *   reduce          SEND count; RECV count on root only (0 elsewhere:
 *                   non-roots accumulate in SCRATCH).  In place (root):
 *                   SEND unused, RECV holds the input.
 *   gather          SEND count; RECV p*count on root only.  In place
 *                   (root): SEND unused, own block already in RECV.
 *   scatter         SEND p*count on root only; RECV count.  In place
 *                   (root): RECV unused, own block stays in SEND.
 *   barrier         no buffers (zero-length messages).
 *   gossip          RECV count, always in place (SEND unused): averaged
 *                   with one partner's (gossip.c).
 *
 * Tags: any 32-bit values, unique per (sender, receiver) pair within one
 * schedule; the engine adds the operation's sequence number.
 */
#ifndef LOOMI_COLL_H
#define LOOMI_COLL_H

#include "sched/sched.h"
#include "core/hostmap.h"

/* Collectives and algorithms by name (LOOM_ALGO). */
enum loomi_coll {
    LOOMI_COLL_ALLREDUCE = 0,
    LOOMI_COLL_REDUCE_SCATTER,
    LOOMI_COLL_ALLGATHER,
    LOOMI_COLL_ALLTOALL,
    LOOMI_COLL_ALLTOALLV,
    LOOMI_COLL_BROADCAST,
    LOOMI_COLL_REDUCE,
    LOOMI_COLL_GATHER,
    LOOMI_COLL_SCATTER,
    LOOMI_COLL_BARRIER,
    LOOMI_COLL_GOSSIP, /* pairwise averaging with one partner (gossip.c) */
    LOOMI_NUM_COLLS
};
/* The collectives whose small calls take the arenas' slots up to a size
 * measured at init (small.c): the first four above. */
#define LOOMI_SMALL_TUNED 4

enum loomi_algo {
    LOOMI_ALGO_AUTO = 0,
    LOOMI_ALGO_RING,
    LOOMI_ALGO_RECURSIVE_DOUBLING,
    LOOMI_ALGO_HALVING_DOUBLING,
    LOOMI_ALGO_TREE,
    LOOMI_ALGO_PAIRWISE,
    LOOMI_ALGO_BRUCK,
    LOOMI_ALGO_SCATTER_ALLGATHER,
    LOOMI_ALGO_HIERARCHICAL, /* intra-host phase, inter-host phase (rails or leaders), intra-host phase */
    LOOMI_ALGO_SHARED,       /* intra-host through the shared arenas (+ rails between hosts) */
    LOOMI_NUM_ALGOS
};

struct loomi_coll_args {
    int coll;     /* enum loomi_coll */
    size_t count; /* elements; see the table above for each collective */
    /* alltoallv only: per peer, in elements (send side / receive side). */
    const size_t *counts, *displs;
    const size_t *rcounts, *rdispls;
    int root;          /* broadcast, reduce, gather, scatter */
    int inplace;       /* the in-place form (see the table above) */
    size_t chunk_bytes; /* pipelining unit for algorithms that cut chunks */
    /* Which ranks share a host (NULL: unknown, treat every rank as its
     * own host).  Hierarchical algorithms need it; with one host or one
     * rank per host they reduce to a flat algorithm. */
    const struct loomi_hostmap *hosts;
    /* Bytes of each rank's shared arena (0: no shared memory). */
    size_t shared_bytes;
    /* The shared allreduce writes its results with streaming stores
     * from this many bytes of vectors on a host (ranks x message) on,
     * out of place; 0: never (LOOM_SHM_STREAM). */
    size_t stream_bytes;
    /* In place past that size, the saves (of what the operation
     * overwrites, for the restore on failure) stream too: whether they
     * should is measured on the communicator's first such calls
     * (a loomi_mode_tuner). */
    int stream_saves;
    /* The staged shared allreduce copies its input into its arena with
     * streaming stores (1) or cached ones (0): measured per size on the
     * communicator's first calls too (see loomi_copyin_tuner). */
    int stream_copyin;
    /* Allreduce: SEND and RECV lie in the loom_mem_alloc window win_id
     * (0: they do not), at these offsets; the window has win_bytes. */
    uint64_t win_id;
    size_t win_send_off, win_recv_off, win_bytes;
    /* Gossip: this rank's partner plus one (0: the seeded pairing of
     * gossip_round under gossip_seed, loomi_gossip_partner; a partner
     * equal to the rank: it sits the round out).  Zeroed arguments are
     * thus round 0 of seed 0, a pairing every rank computes alike. */
    int gossip_peer1;
    uint64_t gossip_round, gossip_seed;
};

/* Whether the shared allreduce streams its results (out of place) for
 * L ranks of a host with `bytes` each: once they hold stream_bytes of
 * vectors together (0: never).  shared.c and the cost model ask here. */
static inline int loomi_shared_streams(size_t stream_bytes, int L, size_t bytes)
{
    return stream_bytes && bytes * (size_t)L >= stream_bytes;
}

/* The shared broadcast's copies out all read the same lines of the root's
 * arena, which stay in the caches; only the receive buffers go to
 * memory, and they stream from a quarter of the allreduce's threshold
 * (streamed was the faster at 8 MiB on 2 and 4 ranks: perf/NOTES.md,
 * "coll.h, streamed broadcast"). */
static inline int loomi_bcast_streams(size_t stream_bytes, int L, size_t bytes)
{
    return bytes > SIZE_MAX / 4 ? stream_bytes != 0
                                : loomi_shared_streams(stream_bytes, L, 4 * bytes);
}

/* Streamed or cached stores where only the machine can tell which is
 * faster, and only a large operation's own working set shows it: the
 * first LOOMI_TUNER_TRIALS such blocking calls of a communicator
 * alternate the two (all ranks alike: their calls come in the same
 * order), each timed; then the faster, by its best time per byte, is
 * kept, cached unless streamed beat it by 5%.
 * - The saves of in-place shared allreduces past stream_bytes (streamed
 *   was the faster on one Intel VM, cached on one AMD VM: perf/NOTES.md,
 *   "coll.h, streamed or cached saves").
 * - The staged shared allreduce's copy of its input into its arena,
 *   which the host's other ranks then read (loomi_copyin_tuner). */
#define LOOMI_TUNER_TRIALS 6
struct loomi_mode_tuner {
    int calls;          /* trial calls timed so far */
    int decided, mode;  /* mode: 1 streamed, 0 cached */
    double best[2];     /* best ns per byte of each mode (0: none yet) */
};
/* The mode for the next call (the trial's, or the one decided). */
int loomi_tuner_mode(const struct loomi_mode_tuner *t);
/* Record a call of `bytes` run in mode `mode` that took `ns`. */
void loomi_tuner_record(struct loomi_mode_tuner *t, int mode, size_t bytes, double ns);

/* The copy-in's tuners, one per power of two of the vector's bytes from
 * LOOMI_COPYIN_MIN (the last one for every size above), in place and out
 * of place apart: time per byte is only comparable between calls of
 * about one size, and jobs call few sizes, over and over.  Streamed, the
 * copy goes to memory and the peers read it from there; cached, they
 * read it from this core's caches, which on some machines is the slower
 * way (an AMD VM whose two cores hand each other cache lines slowly:
 * streamed faster on 4 ranks, in place and out of place; on 2 ranks of
 * the same VM no faster out of place; perf/NOTES.md, "coll.h, streamed
 * copy-in"). */
#define LOOMI_COPYIN_MIN ((size_t)64 << 10)
#define LOOMI_COPYIN_SIZES 24
struct loomi_copyin_tuner {
    struct loomi_mode_tuner t[2][LOOMI_COPYIN_SIZES]; /* [inplace][size] */
};
/* The tuner for a call of `bytes`, NULL below LOOMI_COPYIN_MIN. */
struct loomi_mode_tuner *loomi_copyin_tuner_for(struct loomi_copyin_tuner *c, int inplace,
                                                size_t bytes);

typedef loom_result_t (*loomi_gen_fn)(struct loomi_sched *s, const struct loomi_coll_args *a);

/* The generator of an algorithm for a collective, NULL when it has none. */
loomi_gen_fn loomi_algo_gen(int coll, int algo);
const char *loomi_coll_name(int coll);
const char *loomi_algo_name(int algo);
/* A schedule's signature in its tags (the engine's: collective + 1 and
 * algorithm, 4 bits each) as "(allreduce, ring)": the transports'
 * loomi_tctx.name_sig. */
void loomi_sched_sig_name(unsigned sig, char *buf, size_t n);
/* Algorithms whose schedule depends on which ranks share a host: model.h's
 * closed forms (one link class) leave them out; select.c costs them. */
#define LOOMI_TOPO_ALGOS ((1u << LOOMI_ALGO_HIERARCHICAL) | (1u << LOOMI_ALGO_SHARED))
/* Bit (1u << algo) for each algorithm the collective has. */
unsigned loomi_coll_algos(int coll);
/* Build one rank's schedule for args with a forced algorithm (AUTO: the
 * default choice for the size).  Shared by the engine path, sim and
 * loom-info.  On failure s is freed. */
loom_result_t loomi_coll_build(struct loomi_sched *s, int rank, int nranks,
                               loom_datatype_t dtype, loom_op_t op,
                               const struct loomi_coll_args *a, int algo);
/* The algorithm the library picks without LOOM_ALGO. */
int loomi_algo_default(int coll, int nranks, size_t bytes);

/* ------------------------------------------------------ the generators */

/* ring.c */
loom_result_t loomi_allreduce_ring(struct loomi_sched *s, size_t count, int inplace,
                                   size_t chunk_bytes);
loom_result_t loomi_gen_allreduce_ring(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_reduce_scatter_ring(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_allgather_ring(struct loomi_sched *s, const struct loomi_coll_args *a);
/* recdbl.c */
loom_result_t loomi_gen_allreduce_rd(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_allgather_rd(struct loomi_sched *s, const struct loomi_coll_args *a);
/* halving.c: Rabenseifner allreduce; recursive-halving reduce-scatter */
loom_result_t loomi_gen_allreduce_hd(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_reduce_scatter_hd(struct loomi_sched *s, const struct loomi_coll_args *a);
/* tree.c: pipelined tree allreduce */
loom_result_t loomi_gen_allreduce_tree(struct loomi_sched *s, const struct loomi_coll_args *a);
/* bruck.c: Bruck allgather */
loom_result_t loomi_gen_allgather_bruck(struct loomi_sched *s, const struct loomi_coll_args *a);
/* rooted.c */
loom_result_t loomi_gen_broadcast_tree(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_broadcast_sag(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_reduce_tree(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_reduce_sag(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_gather_tree(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_gather_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_scatter_tree(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_scatter_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a);
/* alltoall.c */
loom_result_t loomi_gen_alltoall_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_alltoall_bruck(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_alltoallv_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a);
/* hier.c: hierarchical (intra-host, inter-host, intra-host), messages only */
loom_result_t loomi_gen_allreduce_hier(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_reduce_scatter_hier(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_allgather_hier(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_broadcast_hier(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_alltoall_hier(struct loomi_sched *s, const struct loomi_coll_args *a);
/* shared.c: intra-host phases through the shared arenas */
loom_result_t loomi_gen_allreduce_shared(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_reduce_scatter_shared(struct loomi_sched *s,
                                              const struct loomi_coll_args *a);
loom_result_t loomi_gen_allgather_shared(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_broadcast_shared(struct loomi_sched *s, const struct loomi_coll_args *a);

/* embed.c: run a collective's generator for a group of ranks inside a
 * bigger schedule (the phases of hierarchical algorithms). */
struct loomi_embed {
    const int *group;            /* real ranks; this rank is group[vrank] */
    int n, vrank;
    uint8_t bufmap[LOOMI_NBUFS]; /* sub-schedule buffer id -> buffer id in s */
    size_t bufoff[LOOMI_NBUFS];  /* bytes added to offsets in each sub buffer */
    uint32_t tag_base;           /* added to every tag; phases use disjoint ranges */
    const uint32_t *after;       /* steps of s that the sub's first steps wait for */
    int nafter;
};
/* Each embedded phase owns this many tags from its tag_base. */
#define LOOMI_EMBED_TAG_SPAN (1u << 24)
/* Append collective `a` run by the group with algorithm `algo` (AUTO: the
 * default for its size).  *join: a step that completes after every step
 * appended, or stands for `after` when nothing was appended, so that a
 * chain of phases keeps its order through an empty one.  Grows
 * s->buf_bytes (and the shared arenas' extent) as needed. */
loom_result_t loomi_embed(struct loomi_sched *s, const struct loomi_embed *e,
                          const struct loomi_coll_args *a, int algo, uint32_t *join);

/* compressed.c: collectives through a codec (fp32, SUM or AVG for the
 * reductions).  They set s->codec and, with z->state, the error-feedback
 * fields of s. */
struct loomi_cz {
    const loom_codec_t *codec;
    loom_codec_state_t state; /* NULL: no error feedback */
    uint64_t key;
};
loom_result_t loomi_gen_allreduce_cz(struct loomi_sched *s, const struct loomi_coll_args *a,
                                     const struct loomi_cz *z);
loom_result_t loomi_gen_reduce_scatter_cz(struct loomi_sched *s, const struct loomi_coll_args *a,
                                          const struct loomi_cz *z);
loom_result_t loomi_gen_allgather_cz(struct loomi_sched *s, const struct loomi_coll_args *a,
                                     const struct loomi_cz *z);

/* gossip.c: this rank's partner in round `round` of the seeded pairing
 * (-1: none, it sits the round out): a perfect matching of the ranks
 * per round, the same on every rank.  nranks a power of two: the
 * hypercube, dimension round % log2(nranks) (exact average after log2
 * nranks rounds); otherwise pairs of a permutation drawn from (seed,
 * round), the last rank of it idle when nranks is odd. */
int loomi_gossip_partner(int rank, int nranks, uint64_t round, uint64_t seed);
/* The pair exchange: send RECV to the partner, receive its RECV into
 * SCRATCH, RECV = (lower + higher) / 2 in the same order on both sides,
 * so that the two end with the same bits. */
loom_result_t loomi_gen_gossip_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a);

/* barrier.c */
loom_result_t loomi_gen_barrier_bruck(struct loomi_sched *s, const struct loomi_coll_args *a);
loom_result_t loomi_gen_barrier_tree(struct loomi_sched *s, const struct loomi_coll_args *a);

/* ------------------------------------------------------ LOOM_ALGO */

struct loom_comm;
/* Parse a LOOM_ALGO string into forced[LOOMI_NUM_COLLS]; an unknown name is
 * an error whose message starts with `what` (where the string came from)
 * and lists the valid ones. */
loom_result_t loomi_algo_parse(const char *what, const char *spec, int forced[LOOMI_NUM_COLLS],
                               int rank);

/* ----------------------------------------- small collectives (small.c) */

/* The bytes of a slot (the largest allreduce that goes through the
 * slots), for LOOM_SHM_SMALL shm_small and arenas of arena_bytes (0: no
 * slots, as when the ranks are on several hosts or there are no arenas). */
size_t loomi_small_limit(size_t shm_small, size_t arena_bytes, int nranks, int nhosts);
/* Does a blocking, uncompressed call of collective coll with n bytes
 * (count times element size) go through the slots? */
int loomi_small_fits(const struct loom_comm *comm, int coll, size_t n, loom_datatype_t dtype,
                     loom_op_t op);
/* How much slower than fp32 sums dtype and op reduce here: class 0 (as
 * fast; also for invalid ones) to LOOMI_RED_CLASSES-1 (comm.h). */
#define LOOMI_RED_CLASSES 4
int loomi_red_class(const struct loom_comm *comm, loom_datatype_t dtype, loom_op_t op);
/* The pairs of class k in words ("bfloat16 sum,avg; ..."), or "none". */
void loomi_red_class_describe(const struct loom_comm *comm, int k, char *buf, size_t len);
/* What rank 0 measures and sends: each class's excess (ns/B beyond fp32
 * sums' of its slowest pair; 0 for class 0), each pair's class, and each
 * class's slowest pair (0xff 0xff: none; always so for class 0). */
struct loomi_red_classes {
    double excess[LOOMI_RED_CLASSES];
    uint8_t cls[LOOM_NUM_DATATYPES][LOOM_NUM_OPS];
    uint8_t rep[LOOMI_RED_CLASSES][2];
};
/* Whether classes that came over the network are in range and
 * consistent (1) before use (algo.c). */
int loomi_red_classes_valid(const struct loomi_red_classes *rc);
/* redclass.c: rank 0 times every reduction kernel and tells the others
 * each pair's class (collective over comm; none with LOOM_PROBE=0); a
 * communicator whose links came from another's (shrink, grow) takes that
 * one's classes with them, untimed. */
loom_result_t loomi_red_classes_measure(struct loom_comm *comm);
/* Measure up to which size allreduce is faster through the slots than
 * through the engine (collective: every rank of comm calls it at init,
 * once the selection is built). */
loom_result_t loomi_small_tune(struct loom_comm *comm);
/* tune.c: on one host, time the allreduce's table against the
 * algorithms the model puts close to it, where vectors fit the caches,
 * and take the faster where one clearly is (collective over the
 * communicator), within about budget_ns: rank 0's, which tells the
 * others (0: time nothing; every rank still calls it). */
#define LOOMI_TUNED 32 /* spans taken over, at most */
loom_result_t loomi_algo_tune(struct loom_comm *comm, uint64_t budget_ns);
/* Run it (fn names the public call in errors) as collective call `no`
 * whose check is chk (comm/calls.h): a one-step schedule (a
 * LOOMI_STEP_SLOT) through the engine. */
loom_result_t loomi_small_coll(struct loom_comm *comm, int coll, const void *sendbuf,
                               void *recvbuf, size_t count, loom_datatype_t dtype,
                               loom_op_t op, const char *fn, uint64_t no, uint32_t chk);

#endif
