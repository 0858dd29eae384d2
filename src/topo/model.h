/*
 * model.h - the alpha-beta-gamma timing model: what an algorithm costs,
 * estimated without running it.
 *
 * Costs (Hockney's model with a compute term, as in Thakur, Rabenseifner
 * & Gropp 2005):
 *   a message of n bytes   alpha + n * beta, occupying the sender's
 *                          outgoing and the receiver's incoming port
 *                          (full duplex: one message at a time per port
 *                          direction);
 *   REDUCE or AVG, n bytes n * gamma on the rank's CPU;
 *   COPY, n bytes          n * gamma_copy on the rank's CPU.
 *
 * Two estimates of the same model:
 *   loomi_model_time      closed forms, microseconds to evaluate: what
 *                         algorithm selection uses;
 *   loomi_model_simulate  an event simulation of the schedules the
 *                         generators really emit, for every rank: slow,
 *                         exact for the model, and a check on the closed
 *                         forms and on the generators.
 *
 * The closed forms describe the generators as they are written (chunk
 * caps, fold of extra ranks, send order); tests/unit/test_model.c checks
 * them against the simulation, so a changed generator shows up there.
 *
 * "bytes" is the collective's count argument times the element size, as
 * loomi_algo_default takes it: the whole vector for allreduce, broadcast
 * and reduce; one rank's block for reduce_scatter (recvcount), allgather,
 * gather and scatter (sendcount); one peer's block for alltoall(v).
 */
#ifndef LOOMI_MODEL_H
#define LOOMI_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

struct loomi_model_params {
    double alpha;       /* seconds per message */
    double beta;        /* seconds per byte over one link direction */
    double gamma;       /* seconds per byte reduced (REDUCE, AVG) */
    double gamma_copy;  /* seconds per byte copied (COPY) */
    size_t chunk_bytes; /* the generators' pipelining unit (LOOM_CHUNK_SIZE) */
};

/* Defaults, for a 10 Gb/s Ethernet cluster and one x86 core per rank:
 *   alpha      20 us     kernel TCP one-way latency with the syscalls and
 *                        epoll wake-ups of a progress loop (10-30 us is
 *                        typical between hosts on one switch);
 *   beta       0.8 ns/B  10 Gb/s = 1.25 GB/s per direction;
 *   gamma      0.1 ns/B  fp32 sum out of cache, two streams in and one
 *                        out, ~10 GB/s of operand on one AVX2 core;
 *   gamma_copy 0.05 ns/B memcpy out of cache, ~20 GB/s;
 *   chunk      2 MiB     LOOM_CHUNK_SIZE's default.
 * loom-info --measure measures this machine instead. */
#define LOOMI_MODEL_ALPHA 20e-6
#define LOOMI_MODEL_BETA 0.8e-9
#define LOOMI_MODEL_GAMMA 0.1e-9
#define LOOMI_MODEL_GAMMA_COPY 0.05e-9
#define LOOMI_MODEL_CHUNK ((size_t)2 << 20)

void loomi_model_defaults(struct loomi_model_params *m);

/* Closed-form time in seconds of collective `coll` (enum loomi_coll) with
 * algorithm `algo` (LOOMI_ALGO_AUTO: loomi_algo_default's choice) on
 * `nranks` ranks, for `bytes` as defined above, op SUM, out of place,
 * root 0.  Negative when the collective has no such algorithm or an
 * argument is out of range. */
double loomi_model_time(int coll, int algo, int nranks, size_t bytes,
                        const struct loomi_model_params *m);

/* The algorithm of `coll` with the least closed-form time (ties: the
 * lower enum value), its time in *t when t is not NULL.  Counts only
 * algorithms in the generator table. */
int loomi_model_best(int coll, int nranks, size_t bytes, const struct loomi_model_params *m,
                     double *t);

/* ------------------------------------------------ event simulation */

struct loomi_model_sim {
    double time;         /* seconds until the last rank finishes */
    uint64_t steps;      /* over all ranks */
    uint64_t messages;   /* over all ranks */
    uint64_t wire_bytes; /* sum of message sizes */
    int over_budget;     /* 1: more than max_steps steps, nothing simulated */
    int last_rank;       /* the rank that finishes last */
};

/* Default step budget of loomi_model_simulate: about 30 bytes a step are
 * held, so 16 M steps is ~0.5 GB and a few seconds. */
#define LOOMI_MODEL_MAX_STEPS ((uint64_t)16 << 20)
/* The most it can be raised to (32-bit indices, 4 edges a step). */
#define LOOMI_MODEL_STEPS_LIMIT ((uint64_t)1 << 28)

/* Build every rank's schedule of (coll, algo) for `count` elements of
 * dtype with op (root 0, out of place; alltoallv with uniform counts) and
 * simulate their run under m.  Returns the generator's error as is
 * (LOOM_ERR_UNSUPPORTED for one not written yet), LOOM_ERR_INTERNAL with
 * a message for schedules that cannot run (a message without its other
 * side, a length mismatch, a deadlock), LOOM_ERR_NO_MEMORY; LOOM_SUCCESS
 * with out->over_budget set when the schedules hold more than max_steps
 * steps (0: LOOMI_MODEL_MAX_STEPS; at most LOOMI_MODEL_STEPS_LIMIT). */
loom_result_t loomi_model_simulate(int coll, int algo, int nranks, loom_datatype_t dtype,
                                   loom_op_t op, size_t count,
                                   const struct loomi_model_params *m, uint64_t max_steps,
                                   struct loomi_model_sim *out);

/* ------------------------------------------------ measuring this host */

/* gamma: fp32 sum with the kernels this CPU runs, over `bytes` (a few
 * MiB: out of the L2 cache); gamma_copy: memcpy of as much. */
loom_result_t loomi_model_measure_cpu(size_t bytes, double *gamma, double *gamma_copy);
/* alpha and beta from a TCP ping-pong over loopback between two threads:
 * alpha is half the median round trip of 8-byte messages, beta comes from
 * round trips of `bytes`-byte messages less 2 alpha.  Loopback moves bytes
 * through memory, not a NIC: its beta says what this host's TCP stack
 * costs, not what the network does. */
loom_result_t loomi_model_measure_net(size_t bytes, double *alpha, double *beta);

#endif
