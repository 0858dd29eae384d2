/*
 * embed.c - a collective run by a group of ranks inside a bigger schedule
 * (the phases of hierarchical algorithms).
 *
 * The group's generator writes a schedule of its own, over virtual ranks
 * 0..n-1, which is then appended step by step: peers through e->group,
 * buffers through e->bufmap (to SEND, RECV, SCRATCH or a shared arena)
 * plus e->bufoff, tags plus e->tag_base, and
 * dependencies shifted to the new indices.  Steps of the sub-schedule
 * that depend on nothing wait for e->after; every other step depends,
 * transitively, on such a root step, so the whole sub-schedule runs after
 * e->after.  The join step waits for the sinks of the sub-DAG (steps
 * nothing depends on), which every step reaches.
 *
 * Tags: each phase owns LOOMI_EMBED_TAG_SPAN (2^24) tags from its
 * tag_base; a sub-schedule with a tag at or above that would spill into
 * the next phase's range and is refused.  256 phases fit in 32 bits.
 *
 * LOOM_AVG: the engine divides by s->nranks, the size of the whole
 * schedule, so an AVG step of a sub-group of another size would divide by
 * the wrong number.  A group smaller than the schedule is therefore built
 * with LOOM_SUM (its reduce steps still run with s->op, which reduces
 * AVG as a sum) and the caller adds the AVG steps where the full sum
 * ends up; a group of all ranks keeps AVG.
 */
#include <stdlib.h>

#include "coll/coll.h"
#include "core/internal.h"


static int map_buf(const struct loomi_embed *e, int b)
{
    /* Shared arenas name the host's arenas, not the group's: unchanged. */
    return b < LOOMI_NBUFS ? e->bufmap[b] : b;
}

static size_t map_off(const struct loomi_embed *e, int b, size_t off)
{
    return b < LOOMI_NBUFS ? off + e->bufoff[b] : off;
}

loom_result_t loomi_embed(struct loomi_sched *s, const struct loomi_embed *e,
                          const struct loomi_coll_args *a, int algo, uint32_t *join)
{
    *join = LOOMI_NO_DEP;
    if (!e || !e->group || e->n < 1 || e->vrank < 0 || e->vrank >= e->n ||
        e->group[e->vrank] != s->rank || e->nafter < 0 || (e->nafter && !e->after))
        return loomi_fail(LOOM_ERR_INTERNAL, s->rank, "loomi_embed: bad group description");
    /* Targets (any uint8_t is one): SEND, RECV, SCRATCH or a shared
     * arena, where the group's buffer then lives from bufoff on. */
    loom_op_t op = s->op == LOOM_AVG && e->n != s->nranks ? LOOM_SUM : s->op;
    struct loomi_sched sub;
    loom_result_t rc = loomi_coll_build(&sub, e->vrank, e->n, s->dtype, op, a, algo);
    if (rc != LOOM_SUCCESS) return rc;
    uint32_t *idx = NULL, *list = NULL;
    uint8_t *has_succ = NULL;
    if (!sub.ok) {
        rc = loomi_fail(LOOM_ERR_NO_MEMORY, s->rank, "loomi_embed: building the %s phase failed",
                        loomi_coll_name(a->coll));
        goto out;
    }
    /* The engine stages input into SCRATCH offset 0 of the whole
     * schedule, not of the group's region: that cannot be mapped. */
    if (sub.scratch_has_input) {
        rc = loomi_fail(LOOM_ERR_INTERNAL, s->rank,
                        "loomi_embed: %s/%s stages its input in scratch (in place); embed the "
                        "out-of-place form", loomi_coll_name(a->coll), loomi_algo_name(algo));
        goto out;
    }
    for (uint32_t i = 0; i < sub.nsteps; i++) {
        const struct loomi_step *st = &sub.steps[i];
        if (st->kind != LOOMI_STEP_SEND && st->kind != LOOMI_STEP_RECV) continue;
        if (st->peer < 0 || st->peer >= e->n || st->tag >= LOOMI_EMBED_TAG_SPAN ||
            e->tag_base > UINT32_MAX - st->tag) {
            rc = loomi_fail(LOOM_ERR_INTERNAL, s->rank,
                            "loomi_embed: %s/%s step %u (peer %d, tag %u) leaves its group or "
                            "its tag range of %u from %u", loomi_coll_name(a->coll),
                            loomi_algo_name(algo), i, st->peer, st->tag, LOOMI_EMBED_TAG_SPAN,
                            e->tag_base);
            goto out;
        }
    }
    size_t nl = (size_t)(e->nafter > (int)sub.nsteps ? e->nafter : (int)sub.nsteps) + 1;
    idx = malloc(((size_t)sub.nsteps + 1) * sizeof *idx);
    list = malloc(nl * sizeof *list);
    has_succ = calloc((size_t)sub.nsteps + 1, 1);
    if (!idx || !list || !has_succ) {
        rc = loomi_fail(LOOM_ERR_NO_MEMORY, s->rank, "loomi_embed: out of memory");
        goto out;
    }
    /* What root steps wait for: e->after itself when it fits in one
     * step's dependencies, else one join of it. */
    uint32_t after[LOOMI_MAX_DEPS];
    int nafter = 0;
    if (e->nafter <= LOOMI_MAX_DEPS) {
        for (int k = 0; k < e->nafter; k++) after[nafter++] = e->after[k];
    } else {
        size_t m = 0;
        for (int k = 0; k < e->nafter; k++)
            if (e->after[k] != LOOMI_NO_DEP) list[m++] = e->after[k];
        after[0] = loomi_sched_join(s, list, m);
        nafter = 1;
    }
    for (uint32_t i = 0; i < sub.nsteps; i++) {
        struct loomi_step st = sub.steps[i];
        if (st.count == 0) {
            /* Offsets of empty steps mean nothing; keep them in range. */
            st.src = st.src2 = st.dst = LOOMI_BUF_RECV;
            st.src_off = st.src2_off = st.dst_off = 0;
        } else {
            switch (st.kind) {
            case LOOMI_STEP_REDUCE:
                st.src2_off = map_off(e, st.src2, st.src2_off);
                st.src2 = (uint8_t)map_buf(e, st.src2);
                /* fall through */
            case LOOMI_STEP_COPY:
            case LOOMI_STEP_SEND:
                st.src_off = map_off(e, st.src, st.src_off);
                st.src = (uint8_t)map_buf(e, st.src);
                if (st.kind == LOOMI_STEP_SEND) break;
                /* fall through */
            case LOOMI_STEP_RECV:
            case LOOMI_STEP_AVG:
                st.dst_off = map_off(e, st.dst, st.dst_off);
                st.dst = (uint8_t)map_buf(e, st.dst);
                break;
            }
        }
        if (st.kind == LOOMI_STEP_SEND || st.kind == LOOMI_STEP_RECV) {
            st.peer = e->group[st.peer];
            st.tag += e->tag_base;
        }
        uint32_t deps[LOOMI_MAX_DEPS];
        int nd = sub.ndeps[i];
        for (int k = 0; k < nd; k++) {
            deps[k] = idx[sub.deps[i][k]];
            has_succ[sub.deps[i][k]] = 1;
        }
        idx[i] = nd ? loomi_sched_add(s, &st, deps, nd) : loomi_sched_add(s, &st, after, nafter);
    }
    /* Extents: the group's use of each buffer, where it was put. */
    for (int b = 0; b < LOOMI_NBUFS; b++) {
        if (!sub.buf_bytes[b]) continue;
        size_t need = e->bufoff[b] + sub.buf_bytes[b];
        int t = e->bufmap[b];
        if (t < LOOMI_NBUFS) {
            if (s->buf_bytes[t] < need) s->buf_bytes[t] = need;
        } else {
            if (s->shared_bytes < need) s->shared_bytes = need;
            if (s->nshared < t - LOOMI_BUF_SHARED + 1) s->nshared = t - LOOMI_BUF_SHARED + 1;
        }
    }
    if (sub.nshared > s->nshared) s->nshared = sub.nshared;
    if (sub.shared_bytes > s->shared_bytes) s->shared_bytes = sub.shared_bytes;
    size_t m = 0;
    if (sub.nsteps) {
        for (uint32_t i = 0; i < sub.nsteps; i++)
            if (!has_succ[i]) list[m++] = idx[i];
    } else {
        /* Nothing appended: the join stands for `after`, so that a chain
         * of phases keeps its order through an empty one. */
        for (int k = 0; k < nafter; k++)
            if (after[k] != LOOMI_NO_DEP) list[m++] = after[k];
    }
    *join = loomi_sched_join(s, list, m);
    if (!s->ok) rc = loomi_fail(LOOM_ERR_NO_MEMORY, s->rank, "loomi_embed: out of memory");
out:
    free(idx);
    free(list);
    free(has_succ);
    loomi_sched_free(&sub);
    return rc;
}
