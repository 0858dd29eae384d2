/*
 * compress.c - the codec registry (built-ins and user codecs, found by
 * spec "name" or "name:args"), the loom_codec_* entry points that check
 * arguments before calling a codec, and the transactional error-feedback
 * state (loom_codec_state_t).
 */
/* The error-feedback loops are plain loops for the vectoriser (see
 * codecs.c). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "core/internal.h"

/* ------------------------------------------------------------- registry */

/* A registered codec: the caller's table, copied, with its name. */
struct codec_base {
    loom_codec_t table;
    char name[LOOM_CODEC_NAME_MAX];
    int builtin;
};

/* An instance: the base table with the params of one spec.  Never freed,
 * so the pointers loom_codec_find hands out stay valid. */
struct codec_inst {
    loom_codec_t c; /* first: a loom_codec_t * is a struct codec_inst * */
    char spec[LOOM_CODEC_SPEC_MAX];
    int builtin;
    struct codec_inst *next;
};

static const loom_codec_t *const builtins[] = {
    &loomi_codec_bf16, &loomi_codec_fp16, &loomi_codec_int8,
    &loomi_codec_int4, &loomi_codec_fp4,  &loomi_codec_topk};
#define N_BUILTINS LOOMI_ARRAY_LEN(builtins)

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct codec_base bases[N_BUILTINS + LOOMI_CODEC_MAX_REGISTERED];
static size_t nbases; /* built-ins first, added at first use */
static struct codec_inst *insts;
static size_t ninsts;

static void add_base(const loom_codec_t *c, int builtin)
{
    struct codec_base *b = &bases[nbases++];
    memcpy(&b->table, c, sizeof b->table);
    b->table.size = sizeof b->table;
    snprintf(b->name, sizeof b->name, "%s", c->name);
    b->table.name = b->name;
    b->builtin = builtin;
}

/* Called with reg_mu held. */
static void ensure_builtins(void)
{
    if (nbases)
        return;
    for (size_t i = 0; i < N_BUILTINS; i++)
        add_base(builtins[i], 1);
}

static struct codec_base *find_base(const char *name, size_t len)
{
    for (size_t i = 0; i < nbases; i++)
        if (strlen(bases[i].name) == len &&
            memcmp(bases[i].name, name, len) == 0)
            return &bases[i];
    return NULL;
}

/* 0 when name is 1 to LOOM_CODEC_NAME_MAX - 1 characters of [a-z0-9_-]. */
static int bad_name(const char *name, size_t len)
{
    if (len == 0 || len >= LOOM_CODEC_NAME_MAX)
        return 1;
    for (size_t i = 0; i < len; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-'))
            return 1;
    }
    return 0;
}

/* A codec from loom_codec_find: its name is the spec of the instance
 * around it (only addresses are compared, nothing is read beyond *c). */
static const struct codec_inst *as_inst(const loom_codec_t *c)
{
    if ((uintptr_t)c->name != (uintptr_t)c + offsetof(struct codec_inst, spec))
        return NULL;
    return (const struct codec_inst *)(const void *)c;
}

#define FAIL_ARG(...) loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, __VA_ARGS__)

loom_result_t loom_codec_register(const loom_codec_t *codec)
{
    static const char fn[] = "loom_codec_register";
    if (!codec)
        return FAIL_ARG("%s: codec is NULL", fn);
    if (codec->size < sizeof(loom_codec_t))
        return FAIL_ARG("%s: codec->size is %zu, less than sizeof(loom_codec_t) "
                        "= %zu",
                        fn, codec->size, sizeof(loom_codec_t));
    if (!codec->name || bad_name(codec->name, strlen(codec->name)))
        return FAIL_ARG("%s: codec->name '%s' is not 1 to %d characters of "
                        "[a-z0-9_-]",
                        fn, codec->name ? codec->name : "(null)",
                        LOOM_CODEC_NAME_MAX - 1);
    unsigned kind = codec->props & LOOMI_CODEC_KINDS;
    if ((codec->props & ~LOOMI_CODEC_KINDS) || !kind || (kind & (kind - 1)))
        return FAIL_ARG("%s: codec->props 0x%x is not exactly one kind "
                        "(LOOM_CODEC_ADDITIVE, _DECODE_REDUCE or _GATHER_ONLY)",
                        fn, codec->props);
    if (!codec->max_encoded_bytes)
        return FAIL_ARG("%s: codec->max_encoded_bytes is NULL", fn);
    if (!codec->encode)
        return FAIL_ARG("%s: codec->encode is NULL", fn);
    if (!codec->decode && !codec->decode_accumulate)
        return FAIL_ARG("%s: codec->decode and codec->decode_accumulate are "
                        "both NULL",
                        fn);
    if (kind == LOOM_CODEC_ADDITIVE && !codec->reduce_encoded)
        return FAIL_ARG("%s: codec->reduce_encoded is NULL for an additive "
                        "codec",
                        fn);
    if (kind != LOOM_CODEC_ADDITIVE && codec->reduce_encoded)
        return FAIL_ARG("%s: codec->reduce_encoded is set for a codec that is "
                        "not additive",
                        fn);
    loom_result_t r = LOOM_SUCCESS;
    pthread_mutex_lock(&reg_mu);
    ensure_builtins();
    if (find_base(codec->name, strlen(codec->name)))
        r = FAIL_ARG("%s: codec->name: a codec named '%s' is already "
                     "registered",
                     fn, codec->name);
    else if (nbases == LOOMI_ARRAY_LEN(bases))
        r = loomi_fail(LOOM_ERR_NO_MEMORY, -1,
                       "%s: codec: %d codecs are registered already, the "
                       "most there may be",
                       fn, LOOMI_CODEC_MAX_REGISTERED);
    else
        add_base(codec, 0);
    pthread_mutex_unlock(&reg_mu);
    return r;
}

loom_result_t loom_codec_find(const char *spec, const loom_codec_t **codec)
{
    static const char fn[] = "loom_codec_find";
    if (!spec)
        return FAIL_ARG("%s: spec is NULL", fn);
    if (!codec)
        return FAIL_ARG("%s: codec is NULL", fn);
    size_t slen = strlen(spec);
    if (slen >= LOOM_CODEC_SPEC_MAX)
        return FAIL_ARG("%s: spec '%.32s...' is longer than %d characters", fn,
                        spec, LOOM_CODEC_SPEC_MAX - 1);
    const char *colon = strchr(spec, ':');
    size_t nlen = colon ? (size_t)(colon - spec) : slen;
    const char *args = colon ? colon + 1 : NULL;

    loom_result_t r = LOOM_SUCCESS;
    pthread_mutex_lock(&reg_mu);
    ensure_builtins();
    struct codec_inst *in = insts;
    while (in && strcmp(in->spec, spec) != 0)
        in = in->next;
    if (in)
        goto done;
    struct codec_base *b = bad_name(spec, nlen) ? NULL : find_base(spec, nlen);
    if (!b) {
        char known[512] = "";
        size_t off = 0;
        for (size_t i = 0; i < nbases && off < sizeof known; i++)
            off += (size_t)snprintf(known + off, sizeof known - off, "%s%s",
                                    i ? ", " : "", bases[i].name);
        r = FAIL_ARG("%s: spec '%s' names no codec (known: %s)", fn, spec,
                     known);
        goto done;
    }
    if (args && !b->table.configure) {
        r = FAIL_ARG("%s: spec '%s': codec %s takes no parameters", fn, spec,
                     b->name);
        goto done;
    }
    if (ninsts == LOOMI_CODEC_MAX_INSTANCES) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, -1,
                       "%s: spec '%s': %d codec specs are in use already, the "
                       "most there may be",
                       fn, spec, LOOMI_CODEC_MAX_INSTANCES);
        goto done;
    }
    in = calloc(1, sizeof *in);
    if (!in) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, -1, "%s: spec '%s'", fn, spec);
        goto done;
    }
    in->c = b->table;
    memcpy(in->spec, spec, slen + 1);
    in->c.name = in->spec;
    in->builtin = b->builtin;
    if (b->table.configure) {
        const void *params = NULL;
        loomi_clear_error();
        r = b->table.configure(&in->c, args, &params);
        if (r != LOOM_SUCCESS) {
            if (!b->builtin || !*loom_get_last_error())
                loomi_fail(r, -1, "%s: spec '%s': codec %s rejected the "
                           "parameters", fn, spec, b->name);
            free(in);
            in = NULL;
            goto done;
        }
        in->c.params = params;
    }
    in->next = insts;
    insts = in;
    ninsts++;
done:
    pthread_mutex_unlock(&reg_mu);
    if (r == LOOM_SUCCESS)
        *codec = &in->c;
    return r;
}

/* ------------------------------------------------------------- checking */

static loom_result_t check_codec(const char *fn, const loom_codec_t *c)
{
    if (!c)
        return FAIL_ARG("%s: codec is NULL", fn);
    if (!as_inst(c))
        return FAIL_ARG("%s: codec is not a codec found by loom_codec_find",
                        fn);
    return LOOM_SUCCESS;
}

/* Do [a, a+na) and [b, b+nb) share a byte? */
static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* A user codec cannot set a message: give its failure one. */
static loom_result_t codec_failed(const char *fn, const loom_codec_t *c,
                                  loom_result_t r)
{
    if (r != LOOM_SUCCESS && !as_inst(c)->builtin)
        loomi_fail(r, -1, "%s: codec %s failed: %s", fn, c->name,
                   loom_strerror(r));
    return r;
}

/* Counts of floats as bytes (count <= SIZE_MAX / 4 is checked first). */
static loom_result_t check_floats(const char *fn, const char *what,
                                  const float *p, size_t count)
{
    if (count > SIZE_MAX / sizeof(float))
        return FAIL_ARG("%s: count %zu is too large", fn, count);
    if (!p && count)
        return FAIL_ARG("%s: %s is NULL", fn, what);
    return LOOM_SUCCESS;
}

/* Decode src into out (set or accumulate) with whichever of the codec's
 * two decoders it has.  out is untouched when the codec fails. */
static loom_result_t run_decode(const char *fn, const loom_codec_t *c,
                                const void *src, size_t len, float *out,
                                size_t count, int accumulate)
{
    loom_result_t r;
    if (accumulate ? c->decode_accumulate != NULL : c->decode != NULL) {
        r = accumulate ? c->decode_accumulate(c, src, len, out, count)
                       : c->decode(c, src, len, out, count);
        return codec_failed(fn, c, r);
    }
    /* Only the other one: go through a scratch buffer. */
    float *tmp = count ? (accumulate ? malloc(count * sizeof *tmp)
                                     : calloc(count, sizeof *tmp))
                       : NULL;
    if (count && !tmp)
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "%s: %zu values to decode",
                          fn, count);
    r = accumulate ? c->decode(c, src, len, tmp, count)
                   : c->decode_accumulate(c, src, len, tmp, count);
    if (r == LOOM_SUCCESS) {
        if (accumulate)
            for (size_t i = 0; i < count; i++)
                out[i] += tmp[i];
        else if (count)
            memcpy(out, tmp, count * sizeof *tmp);
    }
    free(tmp);
    return codec_failed(fn, c, r);
}

static loom_result_t max_bytes(const char *fn, const loom_codec_t *c,
                               size_t count, size_t *bytes)
{
    size_t n = c->max_encoded_bytes(c, count);
    if (!n)
        return FAIL_ARG("%s: count %zu is too large for codec %s", fn, count,
                        c->name);
    *bytes = n;
    return LOOM_SUCCESS;
}

/* The checks of loom_codec_encode and loom_codec_encode_ef. */
static loom_result_t check_encode(const char *fn, const loom_codec_t *c,
                                  const float *src, size_t count,
                                  const void *dst, size_t capacity,
                                  const size_t *len, const float *decoded)
{
    loom_result_t r = check_codec(fn, c);
    if (r == LOOM_SUCCESS)
        r = check_floats(fn, "src", src, count);
    if (r != LOOM_SUCCESS)
        return r;
    if (!dst)
        return FAIL_ARG("%s: dst is NULL", fn);
    if (!len)
        return FAIL_ARG("%s: len is NULL", fn);
    size_t need = 0;
    if ((r = max_bytes(fn, c, count, &need)) != LOOM_SUCCESS)
        return r;
    if (capacity < need)
        return FAIL_ARG("%s: capacity %zu bytes is less than the %zu codec %s "
                        "may need for %zu values",
                        fn, capacity, need, c->name, count);
    size_t fb = count * sizeof(float);
    if (overlap(dst, capacity, src, fb))
        return FAIL_ARG("%s: dst overlaps src", fn);
    if (decoded && overlap(dst, capacity, decoded, fb))
        return FAIL_ARG("%s: decoded overlaps dst", fn);
    if (decoded && decoded != src && overlap(decoded, fb, src, fb))
        return FAIL_ARG("%s: decoded overlaps src without being equal to it",
                        fn);
    return LOOM_SUCCESS;
}

static loom_result_t run_encode(const char *fn, const loom_codec_t *c,
                                const float *src, size_t count, void *dst,
                                size_t capacity, size_t *len)
{
    size_t n = 0;
    loom_result_t r = c->encode(c, src, count, dst, capacity, &n);
    if (r != LOOM_SUCCESS)
        return codec_failed(fn, c, r);
    if (n > capacity)
        return loomi_fail(LOOM_ERR_INTERNAL, -1,
                          "%s: codec %s wrote %zu bytes, more than the "
                          "capacity of %zu",
                          fn, c->name, n, capacity);
    *len = n;
    return LOOM_SUCCESS;
}

/* ------------------------------------------------------- entry points */

loom_result_t loom_codec_max_encoded_bytes(const loom_codec_t *codec,
                                           size_t count, size_t *bytes)
{
    static const char fn[] = "loom_codec_max_encoded_bytes";
    loom_result_t r = check_codec(fn, codec);
    if (r != LOOM_SUCCESS)
        return r;
    if (!bytes)
        return FAIL_ARG("%s: bytes is NULL", fn);
    return max_bytes(fn, codec, count, bytes);
}

loom_result_t loom_codec_encode(const loom_codec_t *codec, const float *src,
                                size_t count, void *dst, size_t capacity,
                                size_t *len, float *decoded)
{
    static const char fn[] = "loom_codec_encode";
    loom_result_t r =
        check_encode(fn, codec, src, count, dst, capacity, len, decoded);
    if (r != LOOM_SUCCESS)
        return r;
    size_t n = 0;
    r = run_encode(fn, codec, src, count, dst, capacity, &n);
    if (r == LOOM_SUCCESS && decoded)
        r = run_decode(fn, codec, dst, n, decoded, count, 0);
    if (r == LOOM_SUCCESS)
        *len = n;
    return r;
}

static loom_result_t decode_entry(const char *fn, const loom_codec_t *c,
                                  const void *src, size_t len, float *out,
                                  size_t count, int accumulate)
{
    loom_result_t r = check_codec(fn, c);
    if (r == LOOM_SUCCESS)
        r = check_floats(fn, accumulate ? "acc" : "dst", out, count);
    if (r != LOOM_SUCCESS)
        return r;
    if (!src)
        return FAIL_ARG("%s: src is NULL", fn);
    if (overlap(src, len, out, count * sizeof(float)))
        return FAIL_ARG("%s: src overlaps %s", fn, accumulate ? "acc" : "dst");
    return run_decode(fn, c, src, len, out, count, accumulate);
}

loom_result_t loom_codec_decode(const loom_codec_t *codec, const void *src,
                                size_t len, float *dst, size_t count)
{
    return decode_entry("loom_codec_decode", codec, src, len, dst, count, 0);
}

loom_result_t loom_codec_decode_accumulate(const loom_codec_t *codec,
                                           const void *src, size_t len,
                                           float *acc, size_t count)
{
    return decode_entry("loom_codec_decode_accumulate", codec, src, len, acc,
                        count, 1);
}

loom_result_t loom_codec_reduce_encoded(const loom_codec_t *codec, void *dst,
                                        const void *src, size_t len)
{
    static const char fn[] = "loom_codec_reduce_encoded";
    loom_result_t r = check_codec(fn, codec);
    if (r != LOOM_SUCCESS)
        return r;
    if (!codec->reduce_encoded)
        return FAIL_ARG("%s: codec %s is not additive: decode-accumulate its "
                        "buffers instead",
                        fn, codec->name);
    if (!dst)
        return FAIL_ARG("%s: dst is NULL", fn);
    if (!src)
        return FAIL_ARG("%s: src is NULL", fn);
    if (dst != src && overlap(dst, len, src, len))
        return FAIL_ARG("%s: dst overlaps src without being equal to it", fn);
    return codec_failed(fn, codec, codec->reduce_encoded(codec, dst, src, len));
}

/* ---------------------------------------------------- error feedback */

struct ef_tensor {
    uint64_t key;
    size_t count;
    float *res;  /* committed residual */
    float *pend; /* this transaction's residual, in the ranges encoded */
    int open;    /* a transaction is under way */
    /* The ranges encoded in this transaction, [lo, hi) pairs in call
     * order: commit copies the rest of res into pend before the swap, so
     * a transaction costs nothing where it encodes nothing. */
    size_t (*ranges)[2];
    size_t nranges, cap_ranges;
    struct ef_tensor *next;
};

struct loom_codec_state {
    pthread_mutex_t mu;
    struct ef_tensor **tab;
    size_t nbuckets; /* a power of two */
    size_t n;
};

static size_t ef_bucket(const struct loom_codec_state *s, uint64_t key)
{
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & (s->nbuckets - 1);
}

static struct ef_tensor **ef_slot(struct loom_codec_state *s, uint64_t key)
{
    struct ef_tensor **p = &s->tab[ef_bucket(s, key)];
    while (*p && (*p)->key != key)
        p = &(*p)->next;
    return p;
}

static void ef_free(struct ef_tensor *t)
{
    free(t->res);
    free(t->pend);
    free(t->ranges);
    free(t);
}

/* Double the table when it holds twice as many tensors as buckets. */
static void ef_grow(struct loom_codec_state *s)
{
    if (s->n < 2 * s->nbuckets)
        return;
    size_t nb = s->nbuckets * 2;
    struct ef_tensor **tab = calloc(nb, sizeof *tab);
    if (!tab)
        return; /* longer chains, still correct */
    struct ef_tensor **old = s->tab;
    size_t onb = s->nbuckets;
    s->tab = tab;
    s->nbuckets = nb;
    for (size_t i = 0; i < onb; i++)
        for (struct ef_tensor *t = old[i], *next; t; t = next) {
            next = t->next;
            size_t b = ef_bucket(s, t->key);
            t->next = tab[b];
            tab[b] = t;
        }
    free(old);
}

loom_result_t loom_codec_state_create(loom_codec_state_t *state)
{
    if (!state)
        return FAIL_ARG("loom_codec_state_create: state is NULL");
    struct loom_codec_state *s = calloc(1, sizeof *s);
    if (s) {
        s->nbuckets = 16;
        s->tab = calloc(s->nbuckets, sizeof *s->tab);
    }
    if (!s || !s->tab) {
        free(s);
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "loom_codec_state_create");
    }
    pthread_mutex_init(&s->mu, NULL);
    *state = s;
    return LOOM_SUCCESS;
}

loom_result_t loom_codec_state_destroy(loom_codec_state_t state)
{
    if (!state)
        return FAIL_ARG("loom_codec_state_destroy: state is NULL");
    for (size_t i = 0; i < state->nbuckets; i++)
        for (struct ef_tensor *t = state->tab[i], *next; t; t = next) {
            next = t->next;
            ef_free(t);
        }
    free(state->tab);
    pthread_mutex_destroy(&state->mu);
    free(state);
    return LOOM_SUCCESS;
}

/* The tensor of key, created (residual zero) at first use, with an open
 * transaction that holds [offset, offset + count); NULL with the error
 * set. */
static struct ef_tensor *ef_begin(const char *fn, struct loom_codec_state *s,
                                  uint64_t key, size_t tensor_count,
                                  size_t offset, size_t count,
                                  loom_result_t *r)
{
    pthread_mutex_lock(&s->mu);
    struct ef_tensor **slot = ef_slot(s, key), *t = *slot;
    if (t && t->count != tensor_count) {
        *r = FAIL_ARG("%s: tensor_count %zu differs from the %zu elements of "
                      "key %llu (reset the key to change it)",
                      fn, tensor_count, t->count, (unsigned long long)key);
        t = NULL;
        goto out;
    }
    if (!t) {
        t = calloc(1, sizeof *t);
        if (t && !(t->res = calloc(tensor_count ? tensor_count : 1,
                                   sizeof *t->res))) {
            free(t);
            t = NULL;
        }
        if (!t) {
            *r = loomi_fail(LOOM_ERR_NO_MEMORY, -1,
                            "%s: residual of %zu values for key %llu", fn,
                            tensor_count, (unsigned long long)key);
            goto out;
        }
        t->key = key;
        t->count = tensor_count;
        *slot = t;
        s->n++;
        ef_grow(s);
    }
    if (!t->pend && !(t->pend = malloc((tensor_count ? tensor_count : 1) *
                                       sizeof *t->pend))) {
        *r = loomi_fail(LOOM_ERR_NO_MEMORY, -1,
                        "%s: pending residual of %zu values for key %llu", fn,
                        tensor_count, (unsigned long long)key);
        t = NULL;
        goto out;
    }
    if (!t->open)
        t->nranges = 0;
    if (t->nranges == t->cap_ranges) {
        size_t cap = t->cap_ranges ? 2 * t->cap_ranges : 16;
        size_t(*rg)[2] = realloc(t->ranges, cap * sizeof *rg);
        if (!rg) {
            *r = loomi_fail(LOOM_ERR_NO_MEMORY, -1, "%s: ranges of key %llu",
                            fn, (unsigned long long)key);
            t = NULL;
            goto out;
        }
        t->ranges = rg;
        t->cap_ranges = cap;
    }
    t->ranges[t->nranges][0] = offset;
    t->ranges[t->nranges][1] = offset + count;
    t->nranges++;
    t->open = 1;
out:
    pthread_mutex_unlock(&s->mu);
    return t;
}

/* A residual that is not finite starts again from 0: its value was sent
 * (no codec hides a NaN or an infinity), and keeping it would poison
 * every later step.  Zeros are stored as +0, so both ways of computing
 * the residual give the same bits. */
static inline float ef_finite(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (u & 0x7fffffffu) - 1u < 0x7f7fffffu ? v : 0.0f;
}

loom_result_t loom_codec_encode_ef(const loom_codec_t *codec,
                                   loom_codec_state_t state, uint64_t key,
                                   size_t tensor_count, size_t offset,
                                   const float *src, size_t count, void *dst,
                                   size_t capacity, size_t *len,
                                   float *decoded)
{
    static const char fn[] = "loom_codec_encode_ef";
    loom_result_t r =
        check_encode(fn, codec, src, count, dst, capacity, len, decoded);
    if (r != LOOM_SUCCESS)
        return r;
    if (!state)
        return FAIL_ARG("%s: state is NULL", fn);
    if (tensor_count > SIZE_MAX / sizeof(float))
        return FAIL_ARG("%s: tensor_count %zu is too large", fn, tensor_count);
    if (offset > tensor_count)
        return FAIL_ARG("%s: offset %zu is beyond tensor_count %zu", fn, offset,
                        tensor_count);
    if (count > tensor_count - offset)
        return FAIL_ARG("%s: count %zu from offset %zu runs past tensor_count "
                        "%zu",
                        fn, count, offset, tensor_count);
    struct ef_tensor *t = ef_begin(fn, state, key, tensor_count, offset,
                                   count, &r);
    if (!t)
        return r;
    /* y = src + residual, in the pending residual's place. */
    float *y = t->pend + offset;
    const float *res = t->res + offset;
    for (size_t i = 0; i < count; i++)
        y[i] = src[i] + res[i];
    size_t n = 0;
    r = run_encode(fn, codec, y, count, dst, capacity, &n);
    if (r == LOOM_SUCCESS && decoded) {
        r = run_decode(fn, codec, dst, n, decoded, count, 0);
        if (r == LOOM_SUCCESS)
            for (size_t i = 0; i < count; i++)
                y[i] = ef_finite(y[i] - decoded[i]);
    } else if (r == LOOM_SUCCESS) {
        /* y - d as -(-y + d), exact, without a scratch buffer. */
        for (size_t i = 0; i < count; i++)
            y[i] = -y[i];
        r = run_decode(fn, codec, dst, n, y, count, 1);
        if (r == LOOM_SUCCESS)
            for (size_t i = 0; i < count; i++)
                y[i] = ef_finite(-y[i]);
    }
    if (r != LOOM_SUCCESS) { /* this range keeps the committed residual */
        if (count)
            memcpy(y, res, count * sizeof *y);
        return r;
    }
    *len = n;
    return LOOM_SUCCESS;
}

static int range_cmp(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static loom_result_t ef_end(const char *fn, loom_codec_state_t s, uint64_t key,
                            int commit)
{
    if (!s)
        return FAIL_ARG("%s: state is NULL", fn);
    pthread_mutex_lock(&s->mu);
    struct ef_tensor *t = *ef_slot(s, key);
    if (t && t->open) {
        if (commit) {
            /* Elements not encoded keep their residual. */
            qsort(t->ranges, t->nranges, sizeof *t->ranges, range_cmp);
            size_t done = 0;
            for (size_t i = 0; i < t->nranges; i++) {
                if (t->ranges[i][0] > done)
                    memcpy(t->pend + done, t->res + done,
                           (t->ranges[i][0] - done) * sizeof *t->pend);
                if (t->ranges[i][1] > done)
                    done = t->ranges[i][1];
            }
            if (t->count > done)
                memcpy(t->pend + done, t->res + done,
                       (t->count - done) * sizeof *t->pend);
            float *tmp = t->res;
            t->res = t->pend;
            t->pend = tmp;
        }
        t->open = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return LOOM_SUCCESS;
}

loom_result_t loom_codec_state_commit(loom_codec_state_t state, uint64_t key)
{
    return ef_end("loom_codec_state_commit", state, key, 1);
}

loom_result_t loom_codec_state_rollback(loom_codec_state_t state,
                                        uint64_t key)
{
    return ef_end("loom_codec_state_rollback", state, key, 0);
}

loom_result_t loom_codec_state_reset(loom_codec_state_t state, uint64_t key)
{
    if (!state)
        return FAIL_ARG("loom_codec_state_reset: state is NULL");
    pthread_mutex_lock(&state->mu);
    struct ef_tensor **slot = ef_slot(state, key), *t = *slot;
    if (t) {
        *slot = t->next;
        state->n--;
        ef_free(t);
    }
    pthread_mutex_unlock(&state->mu);
    return LOOM_SUCCESS;
}

loom_result_t loom_codec_state_residual(loom_codec_state_t state,
                                        uint64_t key, float *residual,
                                        size_t count)
{
    static const char fn[] = "loom_codec_state_residual";
    if (!state)
        return FAIL_ARG("%s: state is NULL", fn);
    loom_result_t r = check_floats(fn, "residual", residual, count);
    if (r != LOOM_SUCCESS)
        return r;
    pthread_mutex_lock(&state->mu);
    struct ef_tensor *t = *ef_slot(state, key);
    if (!t)
        r = FAIL_ARG("%s: key %llu has no residual", fn,
                     (unsigned long long)key);
    else if (t->count != count)
        r = FAIL_ARG("%s: count %zu differs from the %zu elements of key %llu",
                     fn, count, t->count, (unsigned long long)key);
    else if (count)
        memcpy(residual, t->res, count * sizeof *residual);
    pthread_mutex_unlock(&state->mu);
    return r;
}
