/*
 * mlp.h - the model and data of the DiLoCo example: a deterministic
 * synthetic classification task (a random "teacher" network labels
 * Gaussian inputs) and a two-layer ReLU MLP with softmax cross-entropy,
 * hand-written forward and backward passes, and AdamW.  Everything is
 * fp32 and single-threaded; every rank computes the same numbers from
 * the same seed.
 */
#ifndef DILOCO_MLP_H
#define DILOCO_MLP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ random */

/* splitmix64: a counter-based generator, so that sample i of a stream is
 * the same whatever else was drawn before it. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct rng {
    uint64_t s;
} rng_t;

static rng_t rng_make(uint64_t seed, uint64_t stream, uint64_t index)
{
    rng_t r = {mix64(mix64(mix64(seed) ^ stream) ^ index)};
    return r;
}

static uint64_t rng_next(rng_t *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    return mix64(r->s);
}

/* Uniform in [0, 1). */
static double rng_unif(rng_t *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_gauss(rng_t *r)
{
    double u = rng_unif(r), v = rng_unif(r);
    return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

/* ------------------------------------------------------------- data */

/* The task: x ~ N(0, I) in D dimensions; a teacher tanh network with TH
 * hidden units gives logits, and the label is drawn from
 * softmax(sharp * logits), so the best possible cross-entropy (the
 * teacher's own, "floor") is above zero and known. */
enum { TEACHER_HIDDEN = 48 };

typedef struct task {
    int d, classes;
    double sharp;
    float *tw1, *tb1, *tw2; /* TEACHER_HIDDEN x d, TEACHER_HIDDEN, classes x TEACHER_HIDDEN */
} task_t;

typedef struct dataset {
    size_t n;
    int d;
    float *x;    /* n x d */
    int *y;      /* n */
    double floor; /* mean cross-entropy of the teacher's own probabilities */
} dataset_t;

enum { STREAM_TEACHER = 1, STREAM_TRAIN = 2, STREAM_EVAL = 3, STREAM_INIT = 4, STREAM_BATCH = 5 };

static int task_init(task_t *t, uint64_t seed, int d, int classes, double sharp, double tscale)
{
    t->d = d;
    t->classes = classes;
    t->sharp = sharp;
    t->tw1 = malloc(sizeof(float) * TEACHER_HIDDEN * (size_t)d);
    t->tb1 = malloc(sizeof(float) * TEACHER_HIDDEN);
    t->tw2 = malloc(sizeof(float) * (size_t)classes * TEACHER_HIDDEN);
    if (!t->tw1 || !t->tb1 || !t->tw2) return -1;
    rng_t r = rng_make(seed, STREAM_TEACHER, 0);
    for (size_t i = 0; i < (size_t)TEACHER_HIDDEN * (size_t)d; i++)
        t->tw1[i] = (float)(rng_gauss(&r) / sqrt((double)d) * tscale);
    for (int i = 0; i < TEACHER_HIDDEN; i++) t->tb1[i] = (float)(0.3 * rng_gauss(&r));
    for (size_t i = 0; i < (size_t)classes * TEACHER_HIDDEN; i++)
        t->tw2[i] = (float)(rng_gauss(&r) / sqrt((double)TEACHER_HIDDEN));
    return 0;
}

static void task_free(task_t *t)
{
    free(t->tw1);
    free(t->tb1);
    free(t->tw2);
}

/* Samples [first, first + n) of a stream (STREAM_TRAIN or STREAM_EVAL). */
static int dataset_make(dataset_t *ds, const task_t *t, uint64_t seed, int stream,
                        size_t first, size_t n)
{
    int d = t->d, c = t->classes;
    ds->n = n;
    ds->d = d;
    ds->x = malloc(sizeof(float) * n * (size_t)d);
    ds->y = malloc(sizeof(int) * n);
    if (!ds->x || !ds->y) return -1;
    double h[TEACHER_HIDDEN], z[64], nll = 0;
    if (c > 64) return -1;
    for (size_t i = 0; i < n; i++) {
        rng_t r = rng_make(seed, (uint64_t)stream, first + i);
        float *x = ds->x + i * (size_t)d;
        for (int k = 0; k < d; k++) x[k] = (float)rng_gauss(&r);
        for (int j = 0; j < TEACHER_HIDDEN; j++) {
            double a = t->tb1[j];
            for (int k = 0; k < d; k++) a += (double)t->tw1[(size_t)j * d + k] * x[k];
            h[j] = tanh(a);
        }
        double mx = -1e300, sum = 0;
        for (int k = 0; k < c; k++) {
            double a = 0;
            for (int j = 0; j < TEACHER_HIDDEN; j++) a += (double)t->tw2[(size_t)k * TEACHER_HIDDEN + j] * h[j];
            z[k] = t->sharp * a;
            if (z[k] > mx) mx = z[k];
        }
        for (int k = 0; k < c; k++) sum += exp(z[k] - mx);
        double u = rng_unif(&r) * sum, acc = 0;
        int y = c - 1;
        for (int k = 0; k < c; k++) {
            acc += exp(z[k] - mx);
            if (u < acc) { y = k; break; }
        }
        ds->y[i] = y;
        /* The teacher's expected cross-entropy on this x (its entropy). */
        for (int k = 0; k < c; k++) {
            double p = exp(z[k] - mx) / sum;
            if (p > 0) nll -= p * log(p);
        }
    }
    ds->floor = n ? nll / (double)n : 0;
    return 0;
}

static void dataset_free(dataset_t *ds)
{
    free(ds->x);
    free(ds->y);
}

/* ------------------------------------------------------------ model */

/* Parameters in one vector: W1 (hidden x d), b1 (hidden), W2 (classes x
 * hidden), b2 (classes). */
typedef struct mlp {
    int d, hidden, classes;
    size_t nparams;
    size_t ow1, ob1, ow2, ob2; /* offsets */
    float *hpre, *h, *dh;      /* scratch, hidden each */
} mlp_t;

static int mlp_init(mlp_t *m, int d, int hidden, int classes)
{
    m->d = d;
    m->hidden = hidden;
    m->classes = classes;
    m->ow1 = 0;
    m->ob1 = (size_t)hidden * d;
    m->ow2 = m->ob1 + (size_t)hidden;
    m->ob2 = m->ow2 + (size_t)classes * hidden;
    m->nparams = m->ob2 + (size_t)classes;
    m->hpre = malloc(sizeof(float) * (size_t)hidden);
    m->h = malloc(sizeof(float) * (size_t)hidden);
    m->dh = malloc(sizeof(float) * (size_t)hidden);
    return (m->hpre && m->h && m->dh) ? 0 : -1;
}

static void mlp_free(mlp_t *m)
{
    free(m->hpre);
    free(m->h);
    free(m->dh);
}

/* Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) weights, zero biases, from
 * seed alone: every rank starts from the same parameters. */
static void mlp_init_params(const mlp_t *m, float *p, uint64_t seed)
{
    rng_t r = rng_make(seed, STREAM_INIT, 0);
    double s1 = 1.0 / sqrt((double)m->d), s2 = 1.0 / sqrt((double)m->hidden);
    memset(p, 0, sizeof(float) * m->nparams);
    for (size_t i = 0; i < m->ob1; i++) p[m->ow1 + i] = (float)(s1 * (2 * rng_unif(&r) - 1));
    for (size_t i = 0; i < (size_t)m->classes * m->hidden; i++)
        p[m->ow2 + i] = (float)(s2 * (2 * rng_unif(&r) - 1));
}

/* Mean cross-entropy over samples idx[0..b) (all of ds when idx is NULL,
 * b = ds->n); with grad not NULL, grad = its gradient.  *correct (may be
 * NULL) receives the number of samples whose argmax is the label. */
static double mlp_loss(mlp_t *m, const float *p, const dataset_t *ds, const size_t *idx,
                       size_t b, float *grad, size_t *correct)
{
    const int d = m->d, H = m->hidden, C = m->classes;
    const float *w1 = p + m->ow1, *b1 = p + m->ob1, *w2 = p + m->ow2, *b2 = p + m->ob2;
    float *gw1 = grad ? grad + m->ow1 : NULL, *gb1 = grad ? grad + m->ob1 : NULL;
    float *gw2 = grad ? grad + m->ow2 : NULL, *gb2 = grad ? grad + m->ob2 : NULL;
    float z[64], dz[64];
    double loss = 0;
    size_t right = 0;
    const float inv_b = 1.0f / (float)b;
    if (grad) memset(grad, 0, sizeof(float) * m->nparams);
    for (size_t s = 0; s < b; s++) {
        size_t i = idx ? idx[s] : s;
        const float *x = ds->x + i * (size_t)d;
        int y = ds->y[i];
        for (int j = 0; j < H; j++) {
            const float *row = w1 + (size_t)j * d;
            float a = b1[j];
            for (int k = 0; k < d; k++) a += row[k] * x[k];
            m->hpre[j] = a;
            m->h[j] = a > 0 ? a : 0;
        }
        float mx = -INFINITY;
        int arg = 0;
        for (int c = 0; c < C; c++) {
            const float *row = w2 + (size_t)c * H;
            float a = b2[c];
            for (int j = 0; j < H; j++) a += row[j] * m->h[j];
            z[c] = a;
            if (a > mx) { mx = a; arg = c; }
        }
        right += arg == y;
        float sum = 0;
        for (int c = 0; c < C; c++) sum += expf(z[c] - mx);
        loss += (double)(logf(sum) + mx - z[y]);
        if (!grad) continue;
        for (int c = 0; c < C; c++) dz[c] = (expf(z[c] - mx) / sum - (c == y ? 1.0f : 0.0f)) * inv_b;
        memset(m->dh, 0, sizeof(float) * (size_t)H);
        for (int c = 0; c < C; c++) {
            const float *row = w2 + (size_t)c * H;
            float *grow = gw2 + (size_t)c * H, g = dz[c];
            gb2[c] += g;
            for (int j = 0; j < H; j++) {
                grow[j] += g * m->h[j];
                m->dh[j] += row[j] * g;
            }
        }
        for (int j = 0; j < H; j++) {
            if (m->hpre[j] <= 0) continue;
            float g = m->dh[j], *grow = gw1 + (size_t)j * d;
            gb1[j] += g;
            for (int k = 0; k < d; k++) grow[k] += g * x[k];
        }
    }
    if (correct) *correct = right;
    return b ? loss / (double)b : 0;
}

/* ------------------------------------------------------------ AdamW */

typedef struct adamw {
    float lr, beta1, beta2, eps, wd;
    long t;
    float *m, *v;
} adamw_t;

static int adamw_init(adamw_t *o, size_t n, float lr, float beta1, float beta2, float eps, float wd)
{
    o->lr = lr;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->wd = wd;
    o->t = 0;
    o->m = calloc(n, sizeof(float));
    o->v = calloc(n, sizeof(float));
    return (o->m && o->v) ? 0 : -1;
}

static void adamw_free(adamw_t *o)
{
    free(o->m);
    free(o->v);
}

/* One step at learning rate lr (decoupled weight decay, bias correction). */
static void adamw_step(adamw_t *o, float *p, const float *g, size_t n, float lr)
{
    o->t++;
    const float b1 = o->beta1, b2 = o->beta2;
    const float c1 = 1.0f / (1.0f - powf(b1, (float)o->t));
    const float c2 = 1.0f / (1.0f - powf(b2, (float)o->t));
    for (size_t i = 0; i < n; i++) {
        o->m[i] = b1 * o->m[i] + (1 - b1) * g[i];
        o->v[i] = b2 * o->v[i] + (1 - b2) * g[i] * g[i];
        float mh = o->m[i] * c1, vh = o->v[i] * c2;
        p[i] -= lr * (mh / (sqrtf(vh) + o->eps) + o->wd * p[i]);
    }
}

#endif /* DILOCO_MLP_H */
