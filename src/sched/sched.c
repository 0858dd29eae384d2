/* sched.c - building and checking schedules. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "sched/sched.h"

int loomi_sched_init(struct loomi_sched *s, int rank, int nranks,
                     loom_datatype_t dtype, loom_op_t op)
{
    memset(s, 0, sizeof *s);
    s->rank = rank;
    s->nranks = nranks;
    s->dtype = dtype;
    s->op = op;
    s->esize = loom_datatype_size(dtype);
    s->ok = 1;
    return 0;
}

static int grow(struct loomi_sched *s)
{
    uint32_t cap = s->cap ? s->cap * 2 : 64;
    struct loomi_step *st = realloc(s->steps, cap * sizeof *st);
    if (st) s->steps = st;
    uint8_t *nd = realloc(s->ndeps, cap);
    if (nd) s->ndeps = nd;
    uint32_t(*dp)[LOOMI_MAX_DEPS] = realloc(s->deps, cap * sizeof *dp);
    if (dp) s->deps = dp;
    if (!st || !nd || !dp) return -1;
    s->cap = cap;
    return 0;
}

uint32_t loomi_sched_add(struct loomi_sched *s, const struct loomi_step *st,
                         const uint32_t *deps, int ndeps)
{
    if (!s->ok) return LOOMI_NO_DEP;
    if (s->nsteps == s->cap && grow(s)) {
        s->ok = 0;
        return LOOMI_NO_DEP;
    }
    uint32_t i = s->nsteps++;
    s->steps[i] = *st;
    int n = 0;
    for (int d = 0; d < ndeps; d++) {
        if (deps[d] == LOOMI_NO_DEP) continue;
        if (deps[d] >= i || n == LOOMI_MAX_DEPS) { s->ok = 0; continue; }
        s->deps[i][n++] = deps[d];
    }
    s->ndeps[i] = (uint8_t)n;
    return i;
}

/* A step on up to three buffers (dst, src, src2), all else zero but peer, -1; an unused
   buffer is given as buffer 0 at offset 0. */
static struct loomi_step mk3(int kind, int dst, size_t dst_off, int src, size_t src_off,
                             int src2, size_t src2_off, size_t count)
{
    struct loomi_step st;
    memset(&st, 0, sizeof st);
    st.kind = (uint8_t)kind;
    st.peer = -1;
    st.dst = (uint8_t)dst;
    st.dst_off = dst_off;
    st.src = (uint8_t)src;
    st.src_off = src_off;
    st.src2 = (uint8_t)src2;
    st.src2_off = src2_off;
    st.count = count;
    return st;
}

static uint32_t add_p2p(struct loomi_sched *s, struct loomi_step st, int peer, uint32_t tag,
                        const uint32_t *deps, int ndeps)
{
    st.peer = peer;
    st.tag = tag;
    return loomi_sched_add(s, &st, deps, ndeps);
}

uint32_t loomi_sched_send(struct loomi_sched *s, int peer, uint32_t tag, int buf,
                          size_t off, size_t count, const uint32_t *deps, int ndeps)
{
    return add_p2p(s, mk3(LOOMI_STEP_SEND, 0, 0, buf, off, 0, 0, count), peer, tag, deps,
                   ndeps);
}

uint32_t loomi_sched_recv(struct loomi_sched *s, int peer, uint32_t tag, int buf,
                          size_t off, size_t count, const uint32_t *deps, int ndeps)
{
    return add_p2p(s, mk3(LOOMI_STEP_RECV, buf, off, 0, 0, 0, 0, count), peer, tag, deps,
                   ndeps);
}

uint32_t loomi_sched_reduce(struct loomi_sched *s, int dst, size_t dst_off, int a,
                            size_t a_off, int b, size_t b_off, size_t count,
                            const uint32_t *deps, int ndeps)
{
    struct loomi_step st = mk3(LOOMI_STEP_REDUCE, dst, dst_off, a, a_off, b, b_off, count);
    return loomi_sched_add(s, &st, deps, ndeps);
}

/* A copy; src2 is the copy's second destination (ALSO) or save buffer (SAVE). */
static uint32_t add_copy(struct loomi_sched *s, unsigned flags, int dst, size_t dst_off,
                         int src, size_t src_off, int src2, size_t src2_off, size_t count,
                         const uint32_t *deps, int ndeps)
{
    struct loomi_step st =
        mk3(LOOMI_STEP_COPY, dst, dst_off, src, src_off, src2, src2_off, count);
    st.flags = flags;
    return loomi_sched_add(s, &st, deps, ndeps);
}

uint32_t loomi_sched_copy(struct loomi_sched *s, int dst, size_t dst_off, int src,
                          size_t src_off, size_t count, const uint32_t *deps, int ndeps)
{
    return add_copy(s, 0, dst, dst_off, src, src_off, 0, 0, count, deps, ndeps);
}

uint32_t loomi_sched_copy_stream(struct loomi_sched *s, int dst, size_t dst_off, int src,
                                 size_t src_off, size_t count, const uint32_t *deps,
                                 int ndeps)
{
    return add_copy(s, LOOMI_COPY_STREAM, dst, dst_off, src, src_off, 0, 0, count, deps,
                    ndeps);
}

uint32_t loomi_sched_copy_save(struct loomi_sched *s, int dst, size_t dst_off, int src,
                               size_t src_off, int save, size_t save_off, size_t count,
                               const uint32_t *deps, int ndeps)
{
    return add_copy(s, LOOMI_COPY_SAVE, dst, dst_off, src, src_off, save, save_off, count,
                    deps, ndeps);
}

uint32_t loomi_sched_copy2(struct loomi_sched *s, int dst, size_t dst_off, int dst2,
                           size_t dst2_off, int src, size_t src_off, size_t count,
                           const uint32_t *deps, int ndeps)
{
    return add_copy(s, LOOMI_COPY_ALSO, dst, dst_off, src, src_off, dst2, dst2_off, count,
                    deps, ndeps);
}

static int in_range(const struct loomi_sched *s, int buf, size_t off, size_t bytes)
{
    if (buf >= LOOMI_BUF_SHARED && buf < LOOMI_BUF_SHARED + s->nshared)
        return off <= s->shared_bytes && bytes <= s->shared_bytes - off;
    if (buf < 0 || buf >= LOOMI_NBUFS) return 0;
    return off <= s->buf_bytes[buf] && bytes <= s->buf_bytes[buf] - off;
}

loom_result_t loomi_sched_finish(struct loomi_sched *s)
{
    if (s->borrowed) return LOOM_SUCCESS; /* finished before it was cached */
    if (!s->ok)
        return loomi_fail(LOOM_ERR_NO_MEMORY, s->rank,
                          "schedule: out of memory or too many dependencies while building");
    for (uint32_t i = 0; i < s->nsteps; i++) {
        const struct loomi_step *st = &s->steps[i];
        size_t bytes = st->count * s->esize;
        int ok = 1;
        switch (st->kind) {
        case LOOMI_STEP_SEND:
            ok = in_range(s, st->src, st->src_off, bytes) && st->peer >= 0 &&
                 st->peer < s->nranks && (st->peer != s->rank || s->p2p);
            break;
        case LOOMI_STEP_RECV:
            ok = in_range(s, st->dst, st->dst_off, bytes) && st->peer >= 0 &&
                 st->peer < s->nranks && (st->peer != s->rank || s->p2p);
            break;
        case LOOMI_STEP_REDUCE:
            ok = in_range(s, st->src2, st->src2_off, bytes);
            /* fall through */
        case LOOMI_STEP_COPY:
            if (st->kind == LOOMI_STEP_COPY && (st->flags & (LOOMI_COPY_ALSO | LOOMI_COPY_SAVE)))
                ok = in_range(s, st->src2, st->src2_off, bytes);
            ok = ok && in_range(s, st->src, st->src_off, bytes);
            /* fall through */
        case LOOMI_STEP_AVG:
            ok = ok && in_range(s, st->dst, st->dst_off, bytes);
            break;
        case LOOMI_STEP_EXPECT:
            ok = in_range(s, st->src, st->src_off, bytes) &&
                 in_range(s, st->src2, st->src2_off, bytes) && st->peer >= 0 &&
                 st->peer < s->nranks;
            break;
        case LOOMI_STEP_REDUCE_SHARED:
            if (st->flags & LOOMI_RS_SAVE) ok = in_range(s, LOOMI_BUF_SCRATCH, st->dst_off, bytes);
            if (st->flags & LOOMI_RS_PUSH)
                ok = ok && st->dst_off <= SIZE_MAX - s->win_push_off &&
                     in_range(s, LOOMI_BUF_SHARED, s->win_push_off + st->dst_off, bytes);
            ok = ok && s->nshared >= 2 && st->peer >= 0 && st->peer < s->nshared &&
                 in_range(s, LOOMI_BUF_SHARED, st->src2_off, bytes) &&
                 in_range(s, st->src, st->src_off, bytes) && in_range(s, st->dst, st->dst_off, bytes);
            break;
        case LOOMI_STEP_ENCODE:
        case LOOMI_STEP_DECODE:
        case LOOMI_STEP_DECODE_ACC: {
            size_t sb = s->codec ? loomi_codec_slot_bytes(s->codec, st->count) : 0;
            int enc = st->kind == LOOMI_STEP_ENCODE;
            ok = sb && s->dtype == LOOM_FLOAT32 &&
                 in_range(s, st->src, st->src_off, enc ? bytes : sb) &&
                 in_range(s, st->dst, st->dst_off, enc ? sb : bytes);
            if (st->kind == LOOMI_STEP_DECODE_ACC ||
                (enc && (st->flags & LOOMI_ENC_DECODED)))
                ok = ok && in_range(s, st->src2, st->src2_off, bytes);
            if (enc && (st->flags & LOOMI_ENC_EF))
                ok = ok && s->ef_state && st->src_off >= s->ef_base &&
                     (st->src_off - s->ef_base) % s->esize == 0 &&
                     (st->src_off - s->ef_base) / s->esize + st->count <= s->ef_count;
            break;
        }
        case LOOMI_STEP_SLOT: {
            /* Every rank of the schedule reads every rank's slot: one host. */
            const int blocks = (st->flags & LOOMI_SLOT_BLOCKS) != 0;
            const int gather = (st->flags & LOOMI_SLOT_GATHER) != 0;
            const size_t n = (size_t)s->nranks;
            ok = s->nshared == 0 && (!bytes || bytes <= SIZE_MAX / n) &&
                 !((st->flags & LOOMI_SLOT_REDUCE) && gather) &&
                 in_range(s, st->src, st->src_off, blocks ? bytes * n : bytes);
            if (st->flags & (LOOMI_SLOT_REDUCE | LOOMI_SLOT_GATHER))
                ok = ok && in_range(s, st->dst, st->dst_off, gather ? bytes * n : bytes);
            break;
        }
        default:
            ok = 0;
        }
        if (!ok)
            return loomi_fail(LOOM_ERR_INTERNAL, s->rank,
                              "schedule: step %u (kind %d) is out of range or names a bad peer",
                              i, st->kind);
    }
    if (s->desc_len && (s->desc_len > sizeof s->desc ||
                        !in_range(s, LOOMI_BUF_SCRATCH, s->desc_off, s->desc_len)))
        return loomi_fail(LOOM_ERR_INTERNAL, s->rank,
                          "schedule: a descriptor of %zu bytes at SCRATCH+%zu is out of range",
                          s->desc_len, s->desc_off);
    /* Successor lists in CSR form: count, prefix-sum, fill. */
    s->succ_start = calloc((size_t)s->nsteps + 1, sizeof *s->succ_start);
    size_t ne = 0;
    for (uint32_t i = 0; i < s->nsteps; i++) ne += s->ndeps[i];
    s->succ = malloc((ne ? ne : 1) * sizeof *s->succ);
    if (!s->succ_start || !s->succ)
        return loomi_fail(LOOM_ERR_NO_MEMORY, s->rank, "schedule: out of memory");
    for (uint32_t i = 0; i < s->nsteps; i++)
        for (int d = 0; d < s->ndeps[i]; d++) s->succ_start[s->deps[i][d] + 1]++;
    for (uint32_t i = 0; i < s->nsteps; i++) s->succ_start[i + 1] += s->succ_start[i];
    uint32_t *fill = malloc(((size_t)s->nsteps + 1) * sizeof *fill);
    if (!fill) return loomi_fail(LOOM_ERR_NO_MEMORY, s->rank, "schedule: out of memory");
    memcpy(fill, s->succ_start, ((size_t)s->nsteps + 1) * sizeof *fill);
    for (uint32_t i = 0; i < s->nsteps; i++)
        for (int d = 0; d < s->ndeps[i]; d++) s->succ[fill[s->deps[i][d]]++] = i;
    free(fill);
    return LOOM_SUCCESS;
}

void loomi_sched_free(struct loomi_sched *s)
{
    if (s->borrowed) {
        memset(s, 0, sizeof *s);
        return;
    }
    free(s->steps);
    free(s->ndeps);
    free(s->deps);
    free(s->succ_start);
    free(s->succ);
    memset(s, 0, sizeof *s);
}

uint32_t loomi_sched_avg(struct loomi_sched *s, int dst, size_t dst_off, size_t count,
                         const uint32_t *deps, int ndeps)
{
    struct loomi_step st = mk3(LOOMI_STEP_AVG, dst, dst_off, 0, 0, 0, 0, count);
    return loomi_sched_add(s, &st, deps, ndeps);
}

uint32_t loomi_sched_slot(struct loomi_sched *s, int dst, int src, size_t count, unsigned flags)
{
    struct loomi_step st = mk3(LOOMI_STEP_SLOT, dst, 0, src, 0, 0, 0, count);
    st.flags = flags;
    return loomi_sched_add(s, &st, NULL, 0);
}

uint32_t loomi_sched_join(struct loomi_sched *s, uint32_t *list, size_t n)
{
    while (n > 1) {
        size_t m = 0;
        for (size_t i = 0; i < n; i += LOOMI_MAX_DEPS) {
            int k = (int)(n - i < LOOMI_MAX_DEPS ? n - i : LOOMI_MAX_DEPS);
            list[m++] = k == 1 ? list[i]
                               : loomi_sched_copy(s, LOOMI_BUF_RECV, 0, LOOMI_BUF_RECV, 0, 0,
                                                  &list[i], k);
        }
        n = m;
    }
    return n ? list[0] : LOOMI_NO_DEP;
}

uint32_t loomi_sched_expect(struct loomi_sched *s, int a, size_t a_off, int b, size_t b_off,
                            size_t count, int peer, const uint32_t *deps, int ndeps)
{
    struct loomi_step st = mk3(LOOMI_STEP_EXPECT, 0, 0, a, a_off, b, b_off, count);
    st.peer = peer;
    return loomi_sched_add(s, &st, deps, ndeps);
}

uint32_t loomi_sched_reduce_shared(struct loomi_sched *s, int dst, size_t dst_off, int src,
                                   size_t src_off, size_t arena_off, int skip, size_t count,
                                   const uint32_t *deps, int ndeps)
{
    struct loomi_step st = mk3(LOOMI_STEP_REDUCE_SHARED, dst, dst_off, src, src_off,
                               LOOMI_BUF_SHARED, arena_off, count);
    st.peer = skip;
    return loomi_sched_add(s, &st, deps, ndeps);
}

size_t loomi_codec_slot_bytes(const loom_codec_t *codec, size_t n)
{
    size_t m = 0;
    if (loom_codec_max_encoded_bytes(codec, n, &m) != LOOM_SUCCESS || m > SIZE_MAX / 2) return 0;
    return (8 + m + 7) & ~(size_t)7;
}

uint32_t loomi_sched_encode(struct loomi_sched *s, int dst, size_t dst_off, int src,
                            size_t src_off, size_t count, unsigned flags, int dec,
                            size_t dec_off, const uint32_t *deps, int ndeps)
{
    struct loomi_step st = mk3(LOOMI_STEP_ENCODE, dst, dst_off, src, src_off, dec, dec_off, count);
    st.flags = flags;
    return loomi_sched_add(s, &st, deps, ndeps);
}

uint32_t loomi_sched_decode(struct loomi_sched *s, int dst, size_t dst_off, int src,
                            size_t src_off, size_t count, const uint32_t *deps, int ndeps)
{
    struct loomi_step st = mk3(LOOMI_STEP_DECODE, dst, dst_off, src, src_off, 0, 0, count);
    return loomi_sched_add(s, &st, deps, ndeps);
}

uint32_t loomi_sched_decode_acc(struct loomi_sched *s, int dst, size_t dst_off, int base,
                                size_t base_off, int src, size_t src_off, size_t count,
                                const uint32_t *deps, int ndeps)
{
    struct loomi_step st =
        mk3(LOOMI_STEP_DECODE_ACC, dst, dst_off, src, src_off, base, base_off, count);
    return loomi_sched_add(s, &st, deps, ndeps);
}
