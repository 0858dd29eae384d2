/*
 * diloco.c - DiLoCo training with Loom, against synchronous data-parallel
 * training on the same compute budget.  See loom-diloco(7).
 *
 * Each rank (started by loomrun, or any launcher loom_comm_init_env
 * understands) trains a two-layer MLP on its own shard of a synthetic
 * classification task with AdamW.
 *
 *   --mode ddp     every step, the gradients are averaged (LOOM_AVG) over
 *                  the ranks before the AdamW step: synchronous data
 *                  parallel training.
 *   --mode diloco  every H inner steps (--inner), the pseudo-gradient
 *                  delta = params at the start of the round - params now
 *                  is averaged over the ranks (with --codec, compressed;
 *                  with --ef, with error feedback) and an outer Nesterov
 *                  SGD step is taken on the global parameters:
 *                      mom = mu * mom + avg(delta)
 *                      global -= outer_lr * (avg(delta) + mu * mom)
 *                  Each rank keeps its own AdamW state across rounds.
 *   --overlap      (diloco) one-step-delayed outer update: round t's delta
 *                  is averaged with loom_iallreduce_opts while round t+1's
 *                  inner steps run (loom_test between steps drives it).
 *                  At the end of round t+1 the rank waits for it, applies
 *                  the outer step to the global parameters and re-bases
 *                  its local parameters on them, keeping its own progress
 *                  of round t+1:
 *                      local = global(new) - delta(t+1)
 *                  then starts averaging delta(t+1) and runs round t+2
 *                  from the re-based parameters.  So every outer step uses
 *                  the average of a round that is one round old, no round's
 *                  progress is counted twice, and ranks drift apart by at
 *                  most one round's progress.  After the last round the
 *                  outstanding and the last delta are applied in order.
 *   --elastic      (diloco) survive workers that die (shrink, redo the
 *                  round's average) and admit processes started with
 *                  --join between rounds (grow, then loom_state_sync).
 *
 * Rank 0 writes the CSV (--csv) and the final summary line.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <loom.h>

#include "mlp.h"

static int g_rank;

static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "diloco[%d]: ", g_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void check(loom_result_t rc, const char *what)
{
    if (rc != LOOM_SUCCESS)
        die("%s: %s (%s)", what, loom_strerror(rc), loom_get_last_error());
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct opts {
    int diloco, overlap, ef;
    const char *codec_spec, *csv;
    long steps, inner, eval_every;
    uint64_t seed;
    int d, hidden, classes, batch;
    size_t shard, eval_n;
    double sharp, tscale, lr, wd, beta1, beta2, outer_lr, outer_mom, lr_min;
    double timeout_s;                 /* --timeout: the communicator's, unless LOOM_TIMEOUT */
    int cosine, quiet;
    int elastic, join;                /* --elastic, --join */
    long crash_round, crash_rank;     /* --crash-at ROUND:RANK (-1: none) */
    long grow_round, grow_count;      /* --grow-at ROUND:WORKERS (-1: none) */
} opts_t;

static void usage(FILE *f)
{
    fputs("usage: diloco [--mode diloco|ddp] [--codec none|bf16|fp16|int8|int4|fp4|topk:F]\n"
          "              [--ef] [--overlap] [--steps T] [--inner H] [--eval-every N]\n"
          "              [--csv FILE] [--seed S] [--batch B] [--hidden N] [--inputs D]\n"
          "              [--classes C] [--shard N] [--eval N] [--lr X] [--wd X]\n"
          "              [--outer-lr X] [--outer-momentum X] [--const-lr] [--quiet]\n"
          "              [--timeout SECONDS]\n"
          "              [--elastic [--join] [--crash-at ROUND:RANK] [--grow-at ROUND:WORKERS]]\n"
          "Run under loomrun, e.g.: loomrun -n 4 diloco --mode diloco --codec int8\n",
          f);
}

static long parse_long(const char *s, const char *name, long lo)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo) die("bad %s: %s", name, s);
    return v;
}

static double parse_double(const char *s, const char *name)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0)) die("bad %s: %s", name, s);
    return v;
}

/* A:B with A, B >= 0 (--crash-at, --grow-at). */
static void parse_pair(const char *s, const char *name, long *a, long *b)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end != ':' || x < 0) die("bad %s: %s (expected A:B)", name, s);
    *a = x;
    *b = parse_long(end + 1, name, 0);
}

static void parse(opts_t *o, int argc, char **argv)
{
    *o = (opts_t){.diloco = 1, .codec_spec = "none", .steps = 600, .inner = 50, .eval_every = 0,
                  .seed = 1, .d = 64, .hidden = 256, .classes = 10, .batch = 32, .shard = 16384,
                  .eval_n = 4096, .sharp = 6.0, .tscale = 0.7, .lr = 3e-3, .wd = 1e-4, .beta1 = 0.9,
                  .beta2 = 0.99, .outer_lr = 0.7, .outer_mom = 0.5, .lr_min = 0.1, .cosine = 1,
                  .crash_round = -1, .crash_rank = -1, .grow_round = -1, .grow_count = 0,
                  .timeout_s = 600};
    enum { O_MODE = 256, O_CODEC, O_EF, O_OVERLAP, O_STEPS, O_INNER, O_EVERY, O_CSV, O_SEED,
           O_BATCH, O_HIDDEN, O_INPUTS, O_CLASSES, O_SHARD, O_EVAL, O_LR, O_WD, O_OLR, O_OMOM,
           O_CONST, O_QUIET, O_HELP, O_SHARP, O_TSCALE, O_ELASTIC, O_JOIN, O_CRASH, O_GROW,
           O_TIMEOUT };
    static const struct option lo[] = {
        {"mode", 1, 0, O_MODE},       {"codec", 1, 0, O_CODEC},     {"ef", 0, 0, O_EF},
        {"overlap", 0, 0, O_OVERLAP}, {"steps", 1, 0, O_STEPS},     {"inner", 1, 0, O_INNER},
        {"eval-every", 1, 0, O_EVERY}, {"csv", 1, 0, O_CSV},        {"seed", 1, 0, O_SEED},
        {"batch", 1, 0, O_BATCH},     {"hidden", 1, 0, O_HIDDEN},   {"inputs", 1, 0, O_INPUTS},
        {"classes", 1, 0, O_CLASSES}, {"shard", 1, 0, O_SHARD},     {"eval", 1, 0, O_EVAL},
        {"lr", 1, 0, O_LR},           {"wd", 1, 0, O_WD},           {"outer-lr", 1, 0, O_OLR},
        {"outer-momentum", 1, 0, O_OMOM}, {"const-lr", 0, 0, O_CONST}, {"quiet", 0, 0, O_QUIET},
        {"help", 0, 0, O_HELP},       {"sharpness", 1, 0, O_SHARP}, {"teacher-scale", 1, 0, O_TSCALE},
        {"elastic", 0, 0, O_ELASTIC}, {"join", 0, 0, O_JOIN},       {"crash-at", 1, 0, O_CRASH},
        {"grow-at", 1, 0, O_GROW},    {"timeout", 1, 0, O_TIMEOUT}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case O_MODE:
            if (!strcmp(optarg, "diloco")) o->diloco = 1;
            else if (!strcmp(optarg, "ddp")) o->diloco = 0;
            else die("--mode is diloco or ddp, not %s", optarg);
            break;
        case O_CODEC: o->codec_spec = optarg; break;
        case O_EF: o->ef = 1; break;
        case O_OVERLAP: o->overlap = 1; break;
        case O_STEPS: o->steps = parse_long(optarg, "--steps", 1); break;
        case O_INNER: o->inner = parse_long(optarg, "--inner", 1); break;
        case O_EVERY: o->eval_every = parse_long(optarg, "--eval-every", 1); break;
        case O_CSV: o->csv = optarg; break;
        case O_SEED: o->seed = (uint64_t)parse_long(optarg, "--seed", 0); break;
        case O_BATCH: o->batch = (int)parse_long(optarg, "--batch", 1); break;
        case O_HIDDEN: o->hidden = (int)parse_long(optarg, "--hidden", 1); break;
        case O_INPUTS: o->d = (int)parse_long(optarg, "--inputs", 1); break;
        case O_CLASSES: o->classes = (int)parse_long(optarg, "--classes", 2); break;
        case O_SHARD: o->shard = (size_t)parse_long(optarg, "--shard", 1); break;
        case O_EVAL: o->eval_n = (size_t)parse_long(optarg, "--eval", 1); break;
        case O_LR: o->lr = parse_double(optarg, "--lr"); break;
        case O_WD: o->wd = parse_double(optarg, "--wd"); break;
        case O_OLR: o->outer_lr = parse_double(optarg, "--outer-lr"); break;
        case O_OMOM: o->outer_mom = parse_double(optarg, "--outer-momentum"); break;
        case O_CONST: o->cosine = 0; break;
        case O_SHARP: o->sharp = parse_double(optarg, "--sharpness"); break;
        case O_TSCALE: o->tscale = parse_double(optarg, "--teacher-scale"); break;
        case O_ELASTIC: o->elastic = 1; break;
        case O_JOIN: o->join = 1; break;
        case O_CRASH: parse_pair(optarg, "--crash-at", &o->crash_round, &o->crash_rank); break;
        case O_GROW: parse_pair(optarg, "--grow-at", &o->grow_round, &o->grow_count); break;
        case O_QUIET: o->quiet = 1; break;
        case O_TIMEOUT:
            o->timeout_s = parse_double(optarg, "--timeout");
            if (o->timeout_s < 0.001 || o->timeout_s > 86400) die("bad --timeout: %s (0.001 to 86400 s)", optarg);
            break;
        case O_HELP: usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind < argc) die("unexpected argument %s", argv[optind]);
    if (o->classes > 64) die("--classes is at most 64");
    if (o->batch > 1 << 20) die("--batch too large");
    if (!o->diloco && o->overlap) die("--overlap needs --mode diloco");
    if (o->elastic && !o->diloco) die("--elastic needs --mode diloco");
    if (o->elastic && o->overlap) die("--elastic and --overlap cannot be combined");
    if (!o->elastic && (o->join || o->crash_round >= 0 || o->grow_round >= 0))
        die("--join, --crash-at and --grow-at need --elastic");
    if (!o->eval_every) o->eval_every = o->diloco ? o->inner : 50;
}

/* The training state of this rank. */
typedef struct trainer {
    opts_t o;
    loom_comm_t comm;
    int rank, nranks;
    const loom_codec_t *codec;
    loom_codec_state_t ef;
    mlp_t net;
    task_t task;
    dataset_t train, eval;
    size_t np;
    float *local, *grad, *global, *start, *mom, *delta, *comm_buf;
    adamw_t opt;
    rng_t batch_rng;
    size_t *idx;
    uint64_t bytes;
    double t0, eval_time, comm_wait;
    double loss_sum;
    long loss_n;
    FILE *csv;
    /* --elastic: the global step and round the state describes, the next
     * unused data shard, membership changes, and where a joiner came in. */
    uint64_t step, rounds, next_shard;
    int shrinks, grows, joined;
    long joined_step;
} trainer_t;

/* Payload bytes this rank sends for one allreduce of count fp32 values:
 * a ring allreduce (reduce-scatter then allgather) sends 2(n-1) blocks of
 * count/n values each, every block encoded on its own (its header and
 * scales included, loom_codec_max_encoded_bytes); uncompressed, 4 bytes a
 * value, that is 2(n-1)/n * 4 * count.  A gather-only codec (topk) sends
 * its whole encoding to the n-1 others around the ring. */
static uint64_t allreduce_bytes(const trainer_t *t, size_t count)
{
    int n = t->nranks;
    if (n < 2) return 0;
    size_t block = (count + (size_t)n - 1) / (size_t)n, b = 0;
    if (!t->codec) return (uint64_t)2 * (uint64_t)(n - 1) * 4 * block;
    if (t->codec->props & LOOM_CODEC_GATHER_ONLY) {
        check(loom_codec_max_encoded_bytes(t->codec, count, &b), "loom_codec_max_encoded_bytes");
        return (uint64_t)(n - 1) * b;
    }
    check(loom_codec_max_encoded_bytes(t->codec, block, &b), "loom_codec_max_encoded_bytes");
    return (uint64_t)2 * (uint64_t)(n - 1) * b;
}

static loom_coll_options_t coll_opts(const trainer_t *t, uint64_t key)
{
    loom_coll_options_t co = LOOM_COLL_OPTIONS_INITIALIZER;
    co.codec = t->codec;
    if (t->codec && t->ef) {
        co.state = t->ef;
        co.key = key;
    }
    return co;
}

static float inner_lr(const trainer_t *t, long step)
{
    if (!t->o.cosine) return (float)t->o.lr;
    double f = (double)step / (double)t->o.steps;
    return (float)(t->o.lr * (t->o.lr_min + (1 - t->o.lr_min) * 0.5 * (1 + cos(3.141592653589793 * f))));
}

/* One minibatch of this rank's shard: loss, and grad = its gradient. */
static double minibatch(trainer_t *t)
{
    for (int i = 0; i < t->o.batch; i++) t->idx[i] = (size_t)(rng_next(&t->batch_rng) % t->train.n);
    double l = mlp_loss(&t->net, t->local, &t->train, t->idx, (size_t)t->o.batch, t->grad, NULL);
    t->loss_sum += l;
    t->loss_n++;
    return l;
}

/* Time spent training so far (evaluation left out). */
static double train_time(const trainer_t *t) { return now() - t->t0 - t->eval_time; }

/* Evaluate params on the held-out set (every rank does, in parallel, so
 * nobody waits; its time is left out of wall_s) and log a CSV row. */
static double evaluate(trainer_t *t, long step, const float *params, double *acc)
{
    double t1 = now();
    size_t right = 0;
    double l = mlp_loss(&t->net, params, &t->eval, NULL, t->eval.n, NULL, &right);
    t->eval_time += now() - t1;
    double train = t->loss_n ? t->loss_sum / (double)t->loss_n : NAN;
    t->loss_sum = 0;
    t->loss_n = 0;
    if (acc) *acc = (double)right / (double)t->eval.n;
    if (t->rank == 0) {
        /* Elastic: rank 0 may be another process than at the start, so
         * each row is appended by whoever is rank 0 now. */
        if (t->o.elastic && t->o.csv && !(t->csv = fopen(t->o.csv, "a")))
            die("%s: %s", t->o.csv, strerror(errno));
        if (t->csv)
            fprintf(t->csv, "%ld,%.4f,%.6f,%.6f,%llu,%s,%s%s%s\n", step, train_time(t), train, l,
                    (unsigned long long)t->bytes, t->o.diloco ? "diloco" : "ddp", t->o.codec_spec,
                    t->ef ? "+ef" : "", t->o.overlap ? "+overlap" : (t->o.elastic ? "+elastic" : ""));
        if (t->o.elastic && t->csv) {
            if (fclose(t->csv)) die("%s: %s", t->o.csv, strerror(errno));
            t->csv = NULL;
        }
        if (!t->o.quiet)
            printf("step %6ld  wall %8.3f s  train %.4f  eval %.4f  sent %llu B\n", step,
                   train_time(t), train, l, (unsigned long long)t->bytes);
    }
    return l;
}

static void run_ddp(trainer_t *t)
{
    size_t np = t->np;
    loom_coll_options_t co = coll_opts(t, 2);
    for (long s = 0; s < t->o.steps; s++) {
        minibatch(t);
        double w = now();
        check(loom_allreduce_opts(t->grad, t->grad, np, LOOM_FLOAT32, LOOM_AVG, t->comm, &co),
              "loom_allreduce_opts (gradients)");
        t->comm_wait += now() - w;
        t->bytes += allreduce_bytes(t, np);
        adamw_step(&t->opt, t->local, t->grad, np, inner_lr(t, s));
        if ((s + 1) % t->o.eval_every == 0 || s + 1 == t->o.steps)
            evaluate(t, s + 1, t->local, NULL);
    }
    memcpy(t->global, t->local, sizeof(float) * np);
}

/* The outer Nesterov step with the averaged pseudo-gradient avg. */
static void outer_step(trainer_t *t, const float *avg)
{
    const float mu = (float)t->o.outer_mom, lr = (float)t->o.outer_lr;
    for (size_t i = 0; i < t->np; i++) {
        t->mom[i] = mu * t->mom[i] + avg[i];
        t->global[i] -= lr * (avg[i] + mu * t->mom[i]);
    }
}

static void run_diloco(trainer_t *t)
{
    size_t np = t->np;
    loom_coll_options_t co = coll_opts(t, 1);
    loom_request_t req = LOOM_REQUEST_NULL;
    int in_flight = 0;
    long step = 0;
    memcpy(t->start, t->local, sizeof(float) * np);
    while (step < t->o.steps) {
        long h = t->o.inner;
        if (h > t->o.steps - step) h = t->o.steps - step;
        for (long k = 0; k < h; k++, step++) {
            minibatch(t);
            adamw_step(&t->opt, t->local, t->grad, np, inner_lr(t, step));
            if (in_flight && req != LOOM_REQUEST_NULL) {
                int done = 0;
                check(loom_test(&req, &done), "loom_test (pseudo-gradient)");
            }
        }
        /* This round's pseudo-gradient. */
        for (size_t i = 0; i < np; i++) t->delta[i] = t->start[i] - t->local[i];
        if (!t->o.overlap) {
            memcpy(t->comm_buf, t->delta, sizeof(float) * np);
            double w = now();
            check(loom_allreduce_opts(t->comm_buf, t->comm_buf, np, LOOM_FLOAT32, LOOM_AVG,
                                      t->comm, &co),
                  "loom_allreduce_opts (pseudo-gradient)");
            t->comm_wait += now() - w;
            t->bytes += allreduce_bytes(t, np);
            outer_step(t, t->comm_buf);
            memcpy(t->local, t->global, sizeof(float) * np);
        } else {
            if (in_flight) {
                /* Apply the previous round's average, re-base on it. */
                double w = now();
                check(loom_wait(&req), "loom_wait (pseudo-gradient)");
                t->comm_wait += now() - w;
                outer_step(t, t->comm_buf);
                for (size_t i = 0; i < np; i++) t->local[i] = t->global[i] - t->delta[i];
            }
            memcpy(t->comm_buf, t->delta, sizeof(float) * np);
            if (step < t->o.steps) {
                check(loom_iallreduce_opts(t->comm_buf, t->comm_buf, np, LOOM_FLOAT32, LOOM_AVG,
                                           t->comm, &co, &req),
                      "loom_iallreduce_opts (pseudo-gradient)");
                in_flight = 1;
            } else {
                /* The last round: nothing left to overlap with. */
                double w = now();
                check(loom_allreduce_opts(t->comm_buf, t->comm_buf, np, LOOM_FLOAT32, LOOM_AVG,
                                          t->comm, &co),
                      "loom_allreduce_opts (last pseudo-gradient)");
                t->comm_wait += now() - w;
                outer_step(t, t->comm_buf);
                memcpy(t->local, t->global, sizeof(float) * np);
                in_flight = 0;
            }
            t->bytes += allreduce_bytes(t, np);
        }
        memcpy(t->start, t->local, sizeof(float) * np);
        if (step % t->o.eval_every == 0 || step == t->o.steps) evaluate(t, step, t->global, NULL);
    }
}

/* ---- Elastic DiLoCo (--elastic) ----
 *
 * A worker that dies makes the round's allreduce fail on the others
 * (LOOM_ERR_REMOTE or LOOM_ERR_REVOKED); they shrink the communicator and
 * average the round's pseudo-gradients again among themselves.  Between
 * rounds the workers admit processes waiting in loom_comm_join (a
 * replacement started with the job's LOOM_ROOT and LOOM_JOB_KEY, and
 * --join): loom_comm_grow, then loom_state_sync hands the newcomers the
 * global parameters, the outer momentum and the step counters, verified by
 * hash.  A newcomer trains on a data shard nobody has used, with a fresh
 * AdamW state (the inner optimizer state is per worker in DiLoCo). */

static int peer_failed(loom_result_t r) { return r == LOOM_ERR_REMOTE || r == LOOM_ERR_REVOKED; }

static void take_comm(trainer_t *t, loom_comm_t c)
{
    check(loom_comm_destroy(t->comm), "loom_comm_destroy");
    t->comm = c;
    check(loom_comm_rank(c, &t->rank), "loom_comm_rank");
    check(loom_comm_size(c, &t->nranks), "loom_comm_size");
    g_rank = t->rank;
}

/* After an operation failed because a peer did: go on with the survivors. */
static void shrink(trainer_t *t, const char *during, loom_result_t why)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s", loom_get_last_error());
    loom_comm_t s = NULL;
    int before = t->nranks;
    check(loom_comm_shrink(t->comm, &s), "loom_comm_shrink");
    take_comm(t, s);
    t->shrinks++;
    if (t->rank == 0)
        printf("elastic: step %llu: %s failed (%s: %s); shrank from %d to %d ranks\n",
               (unsigned long long)t->step, during, loom_strerror(why), msg, before, t->nranks);
}

/* Everyone leaves with the same global parameters, momentum and counters.
 * member: this process held the state before (a newcomer passes revision 0
 * and so receives it). */
static void sync_state(trainer_t *t, int member)
{
    uint64_t meta[3];
    loom_tensor_t ts[3] = {{t->global, sizeof(float) * t->np},
                           {t->mom, sizeof(float) * t->np},
                           {meta, sizeof meta}};
    for (;;) {
        meta[0] = t->step;
        meta[1] = t->rounds;
        meta[2] = t->next_shard;
        uint64_t rev = member ? t->rounds + 1 : 0;
        loom_result_t r = loom_state_sync(t->comm, ts, 3, &rev);
        if (r == LOOM_SUCCESS) break;
        if (!peer_failed(r)) check(r, "loom_state_sync");
        shrink(t, "loom_state_sync", r);
    }
    t->step = meta[0];
    t->rounds = meta[1];
    /* Newcomers take shards next_shard + their rank, all distinct; then
     * every rank moves past the shards that could have been handed out. */
    t->next_shard = meta[2] + (uint64_t)t->nranks;
    if (member) return;
    uint64_t shard = meta[2] + (uint64_t)t->rank;
    if (dataset_make(&t->train, &t->task, t->o.seed, STREAM_TRAIN, shard * t->o.shard, t->o.shard))
        die("out of memory");
    t->batch_rng = rng_make(t->o.seed, STREAM_BATCH, shard);
    memcpy(t->local, t->global, sizeof(float) * t->np);
    t->joined = 1;
    t->joined_step = (long)t->step;
    printf("elastic: joined at step %llu as rank %d of %d, data shard %llu\n",
           (unsigned long long)t->step, t->rank, t->nranks, (unsigned long long)shard);
}

/* Between rounds: admit the processes waiting to join, if any.  At the
 * --grow-at round, first wait (bounded) until enough are waiting to bring
 * the job to that many workers. */
static void admit(trainer_t *t)
{
    if ((long)t->rounds == t->o.grow_round) {
        double deadline = now() + 120;
        int n = 0;
        for (;;) {
            check(loom_comm_pending_joins(t->comm, &n), "loom_comm_pending_joins");
            if (t->nranks + n >= t->o.grow_count) break;
            if (now() > deadline)
                die("--grow-at: %d workers and %d waiting to join after 120 s, not %ld",
                    t->nranks, n, t->o.grow_count);
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
    for (;;) {
        /* The count announced to each rank may lag: agree on it first,
         * with loom_comm_agree (an allreduce may fail on some ranks only,
         * which would then shrink while the others grow). */
        int32_t n = 0;
        check(loom_comm_pending_joins(t->comm, &n), "loom_comm_pending_joins");
        uint64_t un = (uint64_t)(n > 0 ? n : 0);
        loom_result_t r = loom_comm_agree(t->comm, &un, LOOM_MAX);
        n = (int32_t)un;
        if (peer_failed(r)) { shrink(t, "the join count", r); continue; }
        check(r, "loom_comm_agree (join count)");
        if (n == 0) return;
        loom_comm_t g = NULL;
        int before = t->nranks;
        r = loom_comm_grow(t->comm, &g);
        if (peer_failed(r)) { shrink(t, "loom_comm_grow", r); continue; }
        check(r, "loom_comm_grow");
        if (!g) return;
        take_comm(t, g);
        t->grows++;
        if (t->rank == 0)
            printf("elastic: step %llu: grew from %d to %d ranks\n", (unsigned long long)t->step,
                   before, t->nranks);
        sync_state(t, 1);
        return;
    }
}

static void run_elastic(trainer_t *t)
{
    size_t np = t->np;
    loom_coll_options_t co = coll_opts(t, 1);
    memcpy(t->start, t->local, sizeof(float) * np);
    while ((long)t->step < t->o.steps) {
        long h = t->o.inner;
        if (h > t->o.steps - (long)t->step) h = t->o.steps - (long)t->step;
        for (long k = 0; k < h; k++, t->step++) {
            minibatch(t);
            adamw_step(&t->opt, t->local, t->grad, np, inner_lr(t, (long)t->step));
        }
        for (size_t i = 0; i < np; i++) t->delta[i] = t->start[i] - t->local[i];
        if ((long)t->rounds == t->o.crash_round && t->rank == t->o.crash_rank) {
            /* Fault injection: die as abruptly as a lost machine would. */
            fflush(NULL);
            raise(SIGKILL);
        }
        /* Average the round's pseudo-gradients; after a failure, among the
         * survivors (the buffer is copied again: the average is over them). */
        for (;;) {
            memcpy(t->comm_buf, t->delta, sizeof(float) * np);
            double w = now();
            loom_result_t r = loom_allreduce_opts(t->comm_buf, t->comm_buf, np, LOOM_FLOAT32,
                                                  LOOM_AVG, t->comm, &co);
            t->comm_wait += now() - w;
            if (r == LOOM_SUCCESS) break;
            if (!peer_failed(r)) check(r, "loom_allreduce_opts (pseudo-gradient)");
            shrink(t, "the pseudo-gradient allreduce", r);
        }
        t->bytes += allreduce_bytes(t, np);
        outer_step(t, t->comm_buf);
        t->rounds++;
        memcpy(t->local, t->global, sizeof(float) * np);
        memcpy(t->start, t->local, sizeof(float) * np);
        if ((long)t->step % t->o.eval_every == 0 || (long)t->step == t->o.steps)
            evaluate(t, (long)t->step, t->global, NULL);
        if ((long)t->step < t->o.steps) admit(t);
    }
}

/* FNV-1a over the parameters: do all ranks end with the same bytes? */
static uint64_t params_hash(const float *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

int main(int argc, char **argv)
{
    trainer_t t;
    memset(&t, 0, sizeof t);
    parse(&t.o, argc, argv);
    /* With --overlap a rank waits in the background sum, without
     * progress, until the slowest rank starts it too: up to a round.
     * LOOM_TIMEOUT fails an operation that long without progress, so the
     * communicator gets --timeout unless LOOM_TIMEOUT is set. */
    loom_config_t cfg;
    check(loom_config_init(&cfg), "loom_config_init");
    if (!getenv("LOOM_TIMEOUT")) cfg.timeout_ms = (int)(t.o.timeout_s * 1000 + 0.5);
    if (t.o.join) {
        /* A replacement: wait at the job's rendezvous address until the
         * workers admit it (the timeout bounds the wait). */
        check(loom_comm_join(&t.comm, &cfg), "loom_comm_join");
    } else {
        check(loom_comm_init_env(&t.comm, &cfg), "loom_comm_init_env");
    }
    check(loom_comm_rank(t.comm, &t.rank), "loom_comm_rank");
    check(loom_comm_size(t.comm, &t.nranks), "loom_comm_size");
    g_rank = t.rank;

    if (strcmp(t.o.codec_spec, "none") != 0) {
        check(loom_codec_find(t.o.codec_spec, &t.codec), t.o.codec_spec);
        if (t.o.ef) check(loom_codec_state_create(&t.ef), "loom_codec_state_create");
    }

    if (task_init(&t.task, t.o.seed, t.o.d, t.o.classes, t.o.sharp, t.o.tscale) ||
        dataset_make(&t.eval, &t.task, t.o.seed, STREAM_EVAL, 0, t.o.eval_n) ||
        mlp_init(&t.net, t.o.d, t.o.hidden, t.o.classes))
        die("out of memory");
    /* A joiner learns its shard from the shared state (sync_state). */
    if (!t.o.join &&
        dataset_make(&t.train, &t.task, t.o.seed, STREAM_TRAIN, (size_t)t.rank * t.o.shard, t.o.shard))
        die("out of memory");
    t.np = t.net.nparams;
    size_t np = t.np;
    float **bufs[] = {&t.local, &t.grad, &t.global, &t.start, &t.mom, &t.delta, &t.comm_buf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = calloc(np, sizeof(float)))) die("out of memory");
    if (!(t.idx = malloc(sizeof(size_t) * (size_t)t.o.batch))) die("out of memory");
    if (adamw_init(&t.opt, np, (float)t.o.lr, (float)t.o.beta1, (float)t.o.beta2, 1e-8f, (float)t.o.wd))
        die("out of memory");
    mlp_init_params(&t.net, t.global, t.o.seed);
    memcpy(t.local, t.global, sizeof(float) * np);
    t.batch_rng = rng_make(t.o.seed, STREAM_BATCH, (uint64_t)t.rank);
    t.next_shard = (uint64_t)t.nranks;

    if (t.rank == 0 && !t.o.join) {
        if (t.o.csv) {
            if (!(t.csv = fopen(t.o.csv, "w"))) die("%s: %s", t.o.csv, strerror(errno));
            fputs("step,wall_s,train_loss,eval_loss,bytes_sent,mode,codec\n", t.csv);
            if (t.o.elastic) {
                if (fclose(t.csv)) die("%s: %s", t.o.csv, strerror(errno));
                t.csv = NULL;
            }
        }
        if (!t.o.quiet)
            printf("# %s on %d ranks: %zu parameters, %ld steps of batch %d per rank%s%ld, codec %s%s%s, "
                   "eval floor (teacher) %.4f\n",
                   t.o.diloco ? "diloco" : "ddp", t.nranks, np, t.o.steps, t.o.batch,
                   t.o.diloco ? ", inner steps per round " : "", t.o.diloco ? t.o.inner : 0L,
                   t.o.codec_spec, t.ef ? " with error feedback" : "",
                   t.o.overlap ? ", overlapped (one-step delayed)" : (t.o.elastic ? ", elastic" : ""),
                   t.eval.floor);
    }
    double first = NAN;
    if (t.o.join) {
        t.t0 = now();
        sync_state(&t, 0);
    } else {
        check(loom_barrier(t.comm), "loom_barrier");
        t.t0 = now();
        first = evaluate(&t, 0, t.global, NULL);
    }
    if (t.o.elastic) run_elastic(&t);
    else if (t.o.diloco) run_diloco(&t);
    else run_ddp(&t);
    double wall = train_time(&t), acc = 0;
    t.loss_n = 0;
    size_t right = 0;
    double final = mlp_loss(&t.net, t.global, &t.eval, NULL, t.eval.n, NULL, &right);
    acc = (double)right / (double)t.eval.n;
    int agree = 1;
    if (t.o.elastic) {
        /* max(h) and max(~h) = ~min(h): equal everywhere iff they meet. */
        uint64_t h = params_hash(t.global, np), mm[2] = {h, ~h};
        for (;;) {
            loom_result_t r = loom_allreduce(mm, mm, 2, LOOM_UINT64, LOOM_MAX, t.comm);
            if (r == LOOM_SUCCESS) break;
            if (!peer_failed(r)) check(r, "loom_allreduce (parameter hashes)");
            shrink(&t, "the parameter hash check", r);
            mm[0] = h;
            mm[1] = ~h;
        }
        agree = mm[0] == ~mm[1];
        printf("elastic: rank=%d of %d joined=%d joined_step=%ld shrinks=%d grows=%d "
               "params_hash=%016llx\n",
               t.rank, t.nranks, t.joined, t.joined ? t.joined_step : -1L, t.shrinks, t.grows,
               (unsigned long long)h);
    } else {
        check(loom_barrier(t.comm), "loom_barrier");
    }
    if (t.rank == 0) {
        printf("diloco: mode=%s codec=%s%s%s ranks=%d steps=%ld inner=%ld params=%zu "
               "initial_eval_loss=%.6f final_eval_loss=%.6f eval_accuracy=%.4f floor=%.6f "
               "bytes_sent=%llu wall_s=%.3f comm_wait_s=%.3f",
               t.o.diloco ? "diloco" : "ddp", t.o.codec_spec, t.ef ? "+ef" : "",
               t.o.overlap ? "+overlap" : (t.o.elastic ? "+elastic" : ""), t.nranks, t.o.steps,
               t.o.diloco ? t.o.inner : 1L, np, first, final, acc, t.eval.floor,
               (unsigned long long)t.bytes, wall, t.comm_wait);
        if (t.o.elastic)
            printf(" shrinks=%d grows=%d params_agree=%d", t.shrinks, t.grows, agree);
        printf("\n");
        if (t.csv && fclose(t.csv)) die("%s: %s", t.o.csv, strerror(errno));
    }
    fflush(stdout);
    if (t.ef) loom_codec_state_destroy(t.ef);
    check(loom_comm_destroy(t.comm), "loom_comm_destroy");
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(*bufs[i]);
    free(t.idx);
    adamw_free(&t.opt);
    mlp_free(&t.net);
    task_free(&t.task);
    dataset_free(&t.train);
    dataset_free(&t.eval);
    return agree ? 0 : 1;
}
