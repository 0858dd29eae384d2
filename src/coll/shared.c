/*
 * shared.c - allreduce through the shared arenas of the ranks of a host.
 *
 * Every rank of a host can read every other's arena, so a rank reduces
 * its slice of the vector by reading its peers' data where they put it:
 * one copy in, one read of each peer's slice, one copy out, instead of
 * the 2(L-1) messages of a ring.  Per round (the vector is cut into
 * rounds that fit half an arena; rounds alternate halves so that one
 * round's copies overlap the previous one's reductions):
 *
 *   1. copy-in   my input, except my own slice, into my arena;
 *   2. "in"      zero-byte messages to the host's other ranks: my copy is there;
 *   3. reduce    my slice = my input slice + every peer's copy of it,
 *                written into my arena (nobody else reads that slice yet);
 *   4. rails     with several hosts: allreduce of my slice with the ranks
 *                of the same local index on the other hosts (any flat
 *                algorithm, embedded), in place in my arena;
 *   5. "red"     zero-byte messages: my slice is final;
 *   6. copy-out  every slice from its owner's arena into RECV (with
 *                streaming stores when the host's vectors are too big
 *                for the caches: see LOOMI_COPY_STREAM);
 *   7. "out"     zero-byte messages: I no longer read your arena; the
 *                round two later (same half) waits for them.
 *
 * In place, each round also saves its range of RECV into SCRATCH before
 * the copy-out overwrites it (the copy-in writes the save in the same
 * pass, so the input is read once; my own slice is saved after it): the
 * engine restores from there if the operation fails, instead of copying
 * the whole buffer up front (saves_input).
 *
 * Each slice is reduced by one rank and copied verbatim by the others,
 * so every rank ends with the same bytes.  Hosts must all have the same
 * number of ranks; otherwise, and without arenas, this falls back to a
 * flat ring.
 */
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

enum { SYNC_IN = 0, SYNC_RED = 1, SYNC_OUT = 2, SYNC_KINDS = 3 };

static int fall_back(const struct loomi_sched *s, const struct loomi_coll_args *a,
                     const struct loomi_hostmap *m)
{
    if (!m || m->nranks != s->nranks || m->nhosts == s->nranks || !loomi_hostmap_uniform(m))
        return 1;
    int L = loomi_host_size(m, 0);
    return L < 2 || L > LOOMI_MAX_SHARED || a->shared_bytes / 2 / s->esize < (size_t)L;
}

loom_result_t loomi_gen_allreduce_shared(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const size_t n = a->count, es = s->esize;
    if (loomi_allreduce_trivial(s, n, a->inplace)) return LOOM_SUCCESS;
    const struct loomi_hostmap *m = a->hosts;
    if (fall_back(s, a, m)) return loomi_gen_allreduce_ring(s, a);

    const int me = s->rank, h = m->host_of[me], li = m->local_index[me];
    const int L = loomi_host_size(m, h), H = m->nhosts;
    const int *local = m->host_ranks + m->host_start[h];
    const int in = a->inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const int mine = LOOMI_BUF_SHARED + li;
    /* Elements per round: half an arena, cut on a 64-byte boundary per slice. */
    size_t R = a->shared_bytes / 2 / es;
    const size_t nrounds = (n + R - 1) / R;
    /* Each round's rail allreduce takes one of 128 tag ranges (embed.c). */
    if (H > 1 && nrounds > 128) return loomi_gen_allreduce_hier(s, a);
    s->nshared = L;
    s->shared_bytes = 2 * R * es;
    /* In place: SCRATCH holds the saved input from 0, the rails' scratch
     * after it. */
    const size_t saved = a->inplace ? n * es : 0;
    /* Out of place, RECV is only written, once: past what the caches
     * keep, streaming stores save the read of each line before it is
     * overwritten.  (In place, the copy-in has just read those lines.) */
    const int stream = !a->inplace && loomi_shared_streams(a->stream_bytes, L, n * es);
    if (a->inplace) {
        s->saves_input = 1;
        if (s->buf_bytes[LOOMI_BUF_SCRATCH] < saved) s->buf_bytes[LOOMI_BUF_SCRATCH] = saved;
    }

    int rail_algo = LOOMI_ALGO_AUTO;
    int *rail = NULL;
    size_t rail_scratch = 0;
    if (H > 1) {
        rail = malloc((size_t)H * sizeof *rail);
        if (!rail) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "shared allreduce: out of memory");
        for (int j = 0; j < H; j++) rail[j] = m->host_ranks[m->host_start[j] + li];
    }

    uint32_t *tmp = malloc((size_t)(2 * L + 4) * sizeof *tmp);
    uint32_t outjoin[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    if (!tmp) {
        free(rail);
        return loomi_fail(LOOM_ERR_NO_MEMORY, me, "shared allreduce: out of memory");
    }
    loom_result_t rc = LOOM_SUCCESS;
    for (size_t k = 0; k < nrounds && rc == LOOM_SUCCESS; k++) {
        const size_t b = k * R, len = n - b < R ? n - b : R;
        const size_t hoff = (k % 2) * R * es;
        const uint32_t tag = (uint32_t)k * SYNC_KINDS;
        const struct loomi_seg g = loomi_seg_make(len, L);
        const size_t my0 = loomi_seg_start(&g, li), mylen = loomi_seg_len(&g, li);
        /* The half we write was last read by peers two rounds ago. */
        uint32_t reuse = outjoin[k % 2];

        /* 1. copy-in: everything but my own slice (read from the input
         *    directly); in place, the same pass saves what it copies. */
        int nc = 0;
        const size_t t0 = my0 + mylen;
        if (my0 > 0)
            tmp[nc++] = saved ? loomi_sched_copy2(s, mine, hoff, LOOMI_BUF_SCRATCH, b * es, in,
                                                  b * es, my0, &reuse, 1)
                              : loomi_sched_copy(s, mine, hoff, in, b * es, my0, &reuse, 1);
        if (t0 < len)
            tmp[nc++] = saved ? loomi_sched_copy2(s, mine, hoff + t0 * es, LOOMI_BUF_SCRATCH,
                                                  (b + t0) * es, in, (b + t0) * es, len - t0,
                                                  &reuse, 1)
                              : loomi_sched_copy(s, mine, hoff + t0 * es, in, (b + t0) * es,
                                                 len - t0, &reuse, 1);
        uint32_t cin = loomi_sched_join(s, tmp, (size_t)nc);
        if (cin == LOOMI_NO_DEP) cin = reuse;
        /* In place: save the rest of this round's input (my slice) before
         * anything overwrites it. */
        uint32_t save = LOOMI_NO_DEP;
        if (saved)
            save = loomi_sched_copy(s, LOOMI_BUF_SCRATCH, (b + my0) * es, in, (b + my0) * es,
                                    mylen, &cin, 1);

        /* 2. "in" to and from every other rank of the host. */
        uint32_t *rin = tmp; /* [L] */
        for (int q = 0; q < L; q++) {
            if (q == li) continue;
            loomi_sched_send(s, local[q], tag + SYNC_IN, LOOMI_BUF_RECV, 0, 0, &cin, 1);
            rin[q] = loomi_sched_recv(s, local[q], tag + SYNC_IN, LOOMI_BUF_RECV, 0, 0, NULL, 0);
        }

        /* 3. my slice: my input plus every peer's copy, into my arena,
         *    in one pass once every copy is there. */
        const size_t moff = hoff + my0 * es;
        rin[li] = cin;
        uint32_t last = loomi_sched_join(s, rin, (size_t)L);
        if (mylen) {
            uint32_t d[2] = {last, reuse};
            last = loomi_sched_reduce_shared(s, mine, moff, in, (b + my0) * es, moff, li, mylen,
                                             d, 2);
        }

        /* 4. rails: the same slice on every host. */
        if (H > 1 && mylen) {
            struct loomi_coll_args ra = {.coll = LOOMI_COLL_ALLREDUCE, .count = mylen,
                                         .inplace = 1, .chunk_bytes = a->chunk_bytes};
            if (rail_algo == LOOMI_ALGO_AUTO) {
                /* Chosen for the slices this operation really has (a small
                 * vector must not take a bandwidth algorithm's extra
                 * rounds), sized below for the largest. */
                size_t first = n < R ? n : R;
                rail_algo = loomi_algo_default(LOOMI_COLL_ALLREDUCE, H, (first + L - 1) / L * es);
                /* How much SCRATCH one rail allreduce takes: rounds in
                 * flight together use the two halves of it. */
                struct loomi_sched probe;
                ra.count = (R + L - 1) / L;
                rc = loomi_coll_build(&probe, h, H, s->dtype,
                                      s->op == LOOM_AVG ? LOOM_SUM : s->op, &ra, rail_algo);
                if (rc != LOOM_SUCCESS) break;
                rail_scratch = probe.buf_bytes[LOOMI_BUF_SCRATCH];
                loomi_sched_free(&probe);
                ra.count = mylen;
            }
            struct loomi_embed e = {.group = rail, .n = H, .vrank = h,
                                    .bufmap = {LOOMI_BUF_SEND, (uint8_t)mine, LOOMI_BUF_SCRATCH},
                                    .bufoff = {0, moff, saved + (k % 2) * rail_scratch},
                                    .tag_base = (uint32_t)(1u << 31) + (uint32_t)k * (1u << 24),
                                    .after = &last, .nafter = 1};
            /* The rails add; the average divides once, below, by every rank. */
            loom_op_t op = s->op;
            if (op == LOOM_AVG) s->op = LOOM_SUM;
            uint32_t j;
            rc = loomi_embed(s, &e, &ra, rail_algo, &j);
            s->op = op;
            if (rc != LOOM_SUCCESS) break;
            if (j != LOOMI_NO_DEP) last = j;
        }
        if (mylen && s->op == LOOM_AVG) last = loomi_sched_avg(s, mine, moff, mylen, &last, 1);

        /* 5. "red": my slice is final. */
        uint32_t *rred = tmp + L; /* [L] */
        for (int q = 0; q < L; q++) {
            if (q == li) continue;
            loomi_sched_send(s, local[q], tag + SYNC_RED, LOOMI_BUF_RECV, 0, 0, &last, 1);
            rred[q] = loomi_sched_recv(s, local[q], tag + SYNC_RED, LOOMI_BUF_RECV, 0, 0, NULL, 0);
        }
        rred[li] = last;

        /* 6. copy-out from each owner's arena (after my copy-in read the
         *    input, which in place is this very RECV range). */
        int no = 0;
        for (int q = 0; q < L; q++) {
            size_t q0 = loomi_seg_start(&g, q), ql = loomi_seg_len(&g, q);
            if (!ql) continue;
            uint32_t d[2] = {rred[q], saved ? save : cin};
            tmp[no++] = (stream ? loomi_sched_copy_stream : loomi_sched_copy)(
                s, LOOMI_BUF_RECV, (b + q0) * es, LOOMI_BUF_SHARED + q, hoff + q0 * es, ql, d,
                d[1] == LOOMI_NO_DEP ? 1 : 2);
        }
        for (int q = 0; q < L; q++) tmp[no + q] = rred[q]; /* every "red" received */
        uint32_t cout = loomi_sched_join(s, tmp, (size_t)(no + L));

        /* 7. "out": done reading the host's arenas for this round. */
        for (int q = 0; q < L; q++) {
            if (q == li) continue;
            loomi_sched_send(s, local[q], tag + SYNC_OUT, LOOMI_BUF_RECV, 0, 0, &cout, 1);
            tmp[q] = loomi_sched_recv(s, local[q], tag + SYNC_OUT, LOOMI_BUF_RECV, 0, 0, NULL, 0);
        }
        tmp[li] = cout;
        outjoin[k % 2] = loomi_sched_join(s, tmp, (size_t)L);
    }
    free(tmp);
    free(rail);
    return rc;
}
