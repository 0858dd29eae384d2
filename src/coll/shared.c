/*
 * shared.c - allreduce through the shared arenas of the ranks of a host
 * (and, at the end, reduce-scatter, allgather and broadcast on one host).
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
 *                written into my arena (nobody else reads that slice yet),
 *                and on one host into RECV too, in the same pass;
 *   4. rails     with several hosts: allreduce of my slice with the ranks
 *                of the same local index on the other hosts (any flat
 *                algorithm, embedded), in place in my arena;
 *   5. "red"     zero-byte messages: my slice is final;
 *   6. copy-out  every slice (on one host, every other) from its owner's
 *                arena into RECV (with streaming stores when the host's
 *                vectors are too big for the caches: see LOOMI_COPY_STREAM);
 *   7. "out"     zero-byte messages: I no longer read your arena; the
 *                round two later (same half) waits for them.
 *
 * In place, each round also saves its range of RECV into SCRATCH before
 * the copy-out overwrites it (the copy-in writes the save in the same
 * pass, so the input is read once; the reduction saves my own slice as
 * it overwrites it, or with rails a copy saves it after the copy-in): the
 * engine restores from there if the operation fails, instead of copying
 * the whole buffer up front (saves_input).
 * Below LOOM_SHM_STREAM the saves are cached stores.  Past it they
 * stream or not as a->stream_saves says, which the communicator measures
 * on its first such calls (a loomi_mode_tuner in coll.h): it depends on
 * the machine.  So does the copy-in (a->stream_copyin, measured per size:
 * loomi_copyin_tuner): streamed, the peers read it from memory instead
 * of from this core's caches, which is faster where cores are far apart.
 * Saves streamed against cached, in place: on an AMD VM cached won, on
 * an Intel VM streamed, windows and staged alike (perf/NOTES.md,
 * "shared.c, streamed or cached saves").  The one exception is the
 * separate save of my slice with rails, which the engine always streams
 * (a copy from RECV to SCRATCH in a saves_input schedule): cached, it
 * made 2 x 2 ranks over veth slower in place at 64M and no faster at
 * 1M-8M.
 *
 * With a loom_mem_alloc window (a->win_id: SEND and RECV at the same
 * offsets of every rank's window), nothing is staged: the shared ids
 * name the host's windows, the reduction reads the peers' inputs where
 * they are and writes my slice of RECV, and the copy-out reads the
 * owners' RECV.  Half the memory traffic; see gen_window().
 *
 * The first round's "in" messages carry a descriptor of how each rank
 * runs the operation (window or not, which, at what offsets), and every
 * rank checks its peers' against its own before it reads their memory:
 * a rank whose buffers are elsewhere fails the operation everywhere with
 * LOOM_ERR_MISMATCH instead of having its peers read the wrong bytes.
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

/* The descriptor: window id (0: none), send and receive offsets, and a
 * word saying which it is. */
#define DESC_BYTES 32
#define DESC_WINDOW 0x4c4f4f4d57494e31ull /* "LOOMWIN1" */

/* Round 0's "in" exchange with the host's other ranks, carrying the
 * descriptors, and the checks of theirs against mine: returns the step
 * after which every peer is known to run the operation as this rank
 * does.  rin[q] gets the receive from local rank q.  The descriptors
 * live at SCRATCH + doff: mine, then one per local rank. */
static uint32_t exchange_desc(struct loomi_sched *s, const struct loomi_coll_args *a, int L,
                              int li, const int *local, size_t doff, const uint32_t *after,
                              uint32_t *rin, uint32_t *tmp)
{
    const size_t es = s->esize, cnt = DESC_BYTES / es;
    s->desc_off = doff;
    s->desc_len = DESC_BYTES;
    s->desc[0] = a->win_id ? DESC_WINDOW : 0;
    s->desc[1] = a->win_id;
    s->desc[2] = a->win_id ? a->win_send_off : 0;
    s->desc[3] = a->win_id ? a->win_recv_off : 0;
    int nc = 0;
    for (int q = 0; q < L; q++) {
        if (q == li) continue;
        const size_t qoff = doff + (size_t)(q + 1) * DESC_BYTES;
        loomi_sched_send(s, local[q], SYNC_IN, LOOMI_BUF_SCRATCH, doff, cnt, after,
                         *after == LOOMI_NO_DEP ? 0 : 1);
        rin[q] = loomi_sched_recv(s, local[q], SYNC_IN, LOOMI_BUF_SCRATCH, qoff, cnt, NULL, 0);
        tmp[nc++] = loomi_sched_expect(s, LOOMI_BUF_SCRATCH, doff, LOOMI_BUF_SCRATCH, qoff, cnt,
                                       local[q], &rin[q], 1);
    }
    return loomi_sched_join(s, tmp, (size_t)nc);
}

static int fall_back(const struct loomi_sched *s, const struct loomi_coll_args *a,
                     const struct loomi_hostmap *m)
{
    if (!m || m->nranks != s->nranks || m->nhosts == s->nranks || !loomi_hostmap_uniform(m))
        return 1;
    int L = loomi_host_size(m, 0);
    return L < 2 || L > LOOMI_MAX_SHARED || a->shared_bytes / 2 / s->esize < (size_t)L;
}

/* Elements per round of `per` pieces that fill half an arena, cut on
 * 64-byte bounds where that leaves any (fall_back() saw at least one);
 * sets the arenas the schedule uses. */
static size_t round_elems(struct loomi_sched *s, const struct loomi_coll_args *a, int L, int per)
{
    const size_t es = s->esize, line = 64 / es;
    size_t C = a->shared_bytes / 2 / es / (size_t)per;
    if (C >= line) C -= C % line;
    s->nshared = L;
    s->shared_bytes = 2 * C * (size_t)per * es;
    return C;
}

typedef uint32_t (*copy_fn)(struct loomi_sched *, int, size_t, int, size_t, size_t,
                            const uint32_t *, int);

/* A zero-byte message with `tag` to every other rank of the host once
 * `after` is done, and one from each: got[q] is the receive from local
 * rank q, got[li] = after. */
static void sync_host(struct loomi_sched *s, const int *local, int L, int li, uint32_t tag,
                      uint32_t after, uint32_t *got)
{
    for (int q = 0; q < L; q++) {
        if (q == li) continue;
        loomi_sched_send(s, local[q], tag, LOOMI_BUF_RECV, 0, 0, &after,
                         after == LOOMI_NO_DEP ? 0 : 1);
        got[q] = loomi_sched_recv(s, local[q], tag, LOOMI_BUF_RECV, 0, 0, NULL, 0);
    }
    got[li] = after;
}

/* The rails of round k: allreduce my slice (mylen elements at buf + off)
 * in place with the ranks of my local index on the other hosts, after
 * *last, which then names the end.  The rail algorithm and the SCRATCH
 * it takes (at sbase, a half per round parity) are chosen at the first
 * call (*algo AUTO). */
struct rails {
    const int *group; /* [H] */
    int H, h;
    int algo;
    size_t scratch, sbase;
};

static loom_result_t rail_round(struct loomi_sched *s, const struct loomi_coll_args *a,
                                struct rails *rl, size_t R, int L, size_t k, int buf, size_t off,
                                size_t mylen, uint32_t *last)
{
    const size_t n = a->count, es = s->esize;
    struct loomi_coll_args ra = {.coll = LOOMI_COLL_ALLREDUCE, .count = mylen, .inplace = 1,
                                 .chunk_bytes = a->chunk_bytes};
    loom_result_t rc;
    if (rl->algo == LOOMI_ALGO_AUTO) {
        /* Chosen for the slices this operation really has (a small
         * vector must not take a bandwidth algorithm's extra rounds),
         * sized below for the largest. */
        size_t first = n < R ? n : R;
        rl->algo = loomi_algo_default(LOOMI_COLL_ALLREDUCE, rl->H, (first + L - 1) / L * es);
        /* How much SCRATCH one rail allreduce takes: rounds in flight
         * together use the two halves of it. */
        struct loomi_sched probe;
        ra.count = (R + L - 1) / L;
        rc = loomi_coll_build(&probe, rl->h, rl->H, s->dtype, s->op == LOOM_AVG ? LOOM_SUM : s->op,
                              &ra, rl->algo);
        if (rc != LOOM_SUCCESS) return rc;
        rl->scratch = probe.buf_bytes[LOOMI_BUF_SCRATCH];
        loomi_sched_free(&probe);
        ra.count = mylen;
    }
    struct loomi_embed e = {.group = rl->group, .n = rl->H, .vrank = rl->h,
                            .bufmap = {LOOMI_BUF_SEND, (uint8_t)buf, LOOMI_BUF_SCRATCH},
                            .bufoff = {0, off, rl->sbase + (k % 2) * rl->scratch},
                            .tag_base = (uint32_t)(1u << 31) + (uint32_t)k * (1u << 24),
                            .after = last, .nafter = 1};
    /* The rails add; the average divides once, after, by every rank. */
    loom_op_t op = s->op;
    if (op == LOOM_AVG) s->op = LOOM_SUM;
    uint32_t j;
    rc = loomi_embed(s, &e, &ra, rl->algo, &j);
    s->op = op;
    if (rc == LOOM_SUCCESS && j != LOOMI_NO_DEP) *last = j;
    return rc;
}

/*
 * The window form.  Per round: the reduction of my slice, reading my
 * input and the peers' inputs in their windows (SEND, or RECV in place),
 * into my RECV; rails; "red"; the copy-out of every other slice from its
 * owner's RECV.  (Out of place on one host, the reduction writes my
 * slice into every rank's RECV instead, and there is no copy-out.)  The user's buffers are ready from the start and nothing
 * is reused, so "in" comes once (the descriptors) and "out" once, at the
 * end: the operation completes only when no peer reads this rank's
 * buffers any more.  Per rank that is a read of n and a write of n/L for
 * the reduction and a read and a write of (L-1)/L n for the copy-out,
 * against the staged form's extra copy-in and the reduction's write into
 * the arena.  In place, what this rank overwrites is saved into SCRATCH
 * for the restore on failure (peers overwrite nothing of mine), by the
 * steps that overwrite it, which read each old line once for the save
 * and their own work (LOOMI_RS_SAVE, LOOMI_COPY_SAVE; streamed as the
 * staged form's, above).
 *
 * Why every copied-out line is saved, not only my slice: a rank that
 * had every "red" could finish its copy-out even if a peer then failed
 * (roll forward, no save needed), but the slices it copies are in the
 * peers' RECV, which a peer that has not yet had every "red" restores
 * when it fails.  Whether a failing peer had them cannot be known
 * without another exchange, which a failure can cut in the same way.
 * Results that outlive a restore would need shared memory of n/L per
 * rank beside the window.
 */
static loom_result_t gen_window(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const size_t n = a->count, es = s->esize;
    const struct loomi_hostmap *m = a->hosts;
    const int me = s->rank, h = m->host_of[me], li = m->local_index[me];
    const int L = loomi_host_size(m, h), H = m->nhosts;
    const int *local = m->host_ranks + m->host_start[h];
    const int in = a->inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const size_t soff = a->inplace ? a->win_recv_off : a->win_send_off, roff = a->win_recv_off;
    const size_t top = (soff > roff ? soff : roff);
    if (top > a->win_bytes || n * es > a->win_bytes - top)
        return loomi_fail(LOOM_ERR_INTERNAL, me, "shared allreduce: buffers outside the window");
    /* Rounds as in the staged form, for the pipelining of the reduction
     * against the copy-out (and the rails). */
    const size_t R = a->shared_bytes / 2 / es;
    const size_t nrounds = (n + R - 1) / R;
    if (H > 1 && nrounds > 128) return loomi_gen_allreduce_hier(s, a);
    s->nshared = L;
    s->win_id = a->win_id;
    s->shared_bytes = top + n * es;
    const size_t saved = a->inplace ? n * es : 0;
    const size_t dend = saved + (size_t)(L + 1) * DESC_BYTES;
    /* Big vectors' results (out of place) skip the cache; in place their
     * saves do where that was measured faster (see the top of this file). */
    const int big = loomi_shared_streams(a->stream_bytes, L, n * es);
    const int stream = !a->inplace && big, ssave = a->inplace && big && a->stream_saves;
    /* Out of place on one host, the reducer of a slice writes it into
     * every rank's RECV (nobody reads RECV during the operation): each
     * rank reads n and writes n, the bound, instead of reading the
     * others' slices back.  In place that would overwrite peers' inputs,
     * which they would have to save for us; with rails, the slice is
     * final only after them. */
    const int push = !a->inplace && H == 1;
    s->win_push_off = roff;
    if (a->inplace) s->saves_input = 1;
    if (s->buf_bytes[LOOMI_BUF_SCRATCH] < dend) s->buf_bytes[LOOMI_BUF_SCRATCH] = dend;

    int *rail = NULL;
    uint32_t *tmp = malloc((size_t)(2 * L + 4) * sizeof *tmp);
    uint32_t *outs = malloc(nrounds * sizeof *outs);
    if (H > 1) rail = malloc((size_t)H * sizeof *rail);
    if (!tmp || !outs || (H > 1 && !rail)) {
        free(tmp);
        free(outs);
        free(rail);
        return loomi_fail(LOOM_ERR_NO_MEMORY, me, "shared allreduce: out of memory");
    }
    for (int j = 0; j < H && rail; j++) rail[j] = m->host_ranks[m->host_start[j] + li];
    struct rails rl = {.group = rail, .H = H, .h = h, .algo = LOOMI_ALGO_AUTO, .sbase = dend};

    /* "in": the descriptors; nothing of a peer is read before they match. */
    const uint32_t none = LOOMI_NO_DEP;
    uint32_t chk = exchange_desc(s, a, L, li, local, saved, &none, tmp, tmp + L);
    /* Rails of round k use SCRATCH half k % 2, free again once round k-2's
     * rail allreduce is over. */
    uint32_t rail_done[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    loom_result_t rc = LOOM_SUCCESS;
    for (size_t k = 0; k < nrounds && rc == LOOM_SUCCESS; k++) {
        const size_t b = k * R, len = n - b < R ? n - b : R;
        const uint32_t tag = (uint32_t)k * SYNC_KINDS;
        const struct loomi_seg g = loomi_seg_make(len, L);
        const size_t my0 = loomi_seg_start(&g, li), mylen = loomi_seg_len(&g, li);
        const size_t mine = (b + my0) * es;

        /* In place, the reduction saves my slice as it overwrites it, and
         * the copy-out the others (LOOMI_RS_SAVE, LOOMI_COPY_SAVE).  Out
         * of place on one host it pushes my slice into every RECV. */
        uint32_t last = chk;
        if (mylen) {
            uint32_t d[2] = {chk, rail_done[k % 2]};
            last = loomi_sched_reduce_shared(s, LOOMI_BUF_RECV, mine, in, mine, soff + mine, li,
                                             mylen, d, 2);
            if (saved) s->steps[last].flags |= LOOMI_RS_SAVE | (ssave ? LOOMI_RS_STREAM : 0);
            if (push) s->steps[last].flags |= LOOMI_RS_PUSH | (stream ? LOOMI_RS_STREAM : 0);
        }
        if (H > 1 && mylen) {
            rc = rail_round(s, a, &rl, R, L, k, LOOMI_BUF_RECV, mine, mylen, &last);
            if (rc != LOOM_SUCCESS) break;
            rail_done[k % 2] = last;
        }
        if (mylen && s->op == LOOM_AVG && !push)
            last = loomi_sched_avg(s, LOOMI_BUF_RECV, mine, mylen, &last, 1);

        /* "red": my slice of RECV is final (pushed: it is in yours). */
        uint32_t *rred = tmp; /* [L] */
        sync_host(s, local, L, li, tag + SYNC_RED, last, rred);
        /* Copy-out of the others' slices from their RECV. */
        int no = 0;
        uint32_t *cps = tmp + L;
        for (int q = 0; q < L; q++) {
            size_t q0 = loomi_seg_start(&g, q), ql = loomi_seg_len(&g, q);
            if (push) {
                cps[no++] = rred[q];
                continue;
            }
            if (q == li || !ql) continue;
            uint32_t d[2] = {rred[q], chk};
            const size_t at = (b + q0) * es;
            if (saved) {
                cps[no] = loomi_sched_copy_save(s, LOOMI_BUF_RECV, at, LOOMI_BUF_SHARED + q,
                                                roff + at, LOOMI_BUF_SCRATCH, at, ql, d, 2);
                if (ssave) s->steps[cps[no]].flags |= LOOMI_COPY_STREAM;
                no++;
            }
            else
                cps[no++] = (stream ? loomi_sched_copy_stream : loomi_sched_copy)(
                    s, LOOMI_BUF_RECV, at, LOOMI_BUF_SHARED + q, roff + at, ql, d, 2);
        }
        cps[no++] = last;
        outs[k] = loomi_sched_join(s, cps, (size_t)no);
    }
    if (rc == LOOM_SUCCESS && push) {
        /* Each "red" says its sender is done with my SEND and my RECV. */
        loomi_sched_join(s, outs, nrounds);
    } else if (rc == LOOM_SUCCESS) {
        /* "out": done with every peer's buffers; done only when they are
         * done with mine. */
        uint32_t cout = loomi_sched_join(s, outs, nrounds);
        sync_host(s, local, L, li, (uint32_t)(nrounds - 1) * SYNC_KINDS + SYNC_OUT, cout, tmp);
    }
    free(tmp);
    free(outs);
    free(rail);
    return rc;
}

loom_result_t loomi_gen_allreduce_shared(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const size_t n = a->count, es = s->esize;
    if (loomi_allreduce_trivial(s, n, a->inplace)) return LOOM_SUCCESS;
    const struct loomi_hostmap *m = a->hosts;
    if (fall_back(s, a, m)) return loomi_gen_allreduce_ring(s, a);
    if (a->win_id) return gen_window(s, a);

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
    /* Then the descriptors (exchange_desc), then the rails' scratch. */
    const size_t dend = saved + (size_t)(L + 1) * DESC_BYTES;
    /* Out of place, RECV is only written, once: past what the caches
     * keep, streaming stores save the read of each line before it is
     * overwritten.  (In place, the copy-in has just read those lines;
     * the saves stream where that was measured faster: see the top of
     * this file.) */
    const int big = loomi_shared_streams(a->stream_bytes, L, n * es);
    const int stream = !a->inplace && big, ssave = a->inplace && big && a->stream_saves;
    /* On one host, my slice is final once reduced: the reduction writes
     * it to RECV and to my arena in one pass (LOOMI_RS_KEEP), and my
     * copy-out skips it (in place it also saves what it overwrites): a
     * read and a write of n/L less per rank.  With rails the slice is
     * final only after them, in the arena. */
    const int keep = H == 1;
    if (a->inplace) s->saves_input = 1;
    if (s->buf_bytes[LOOMI_BUF_SCRATCH] < dend) s->buf_bytes[LOOMI_BUF_SCRATCH] = dend;
    uint32_t chk = LOOMI_NO_DEP;

    int *rail = NULL;
    if (H > 1) {
        rail = malloc((size_t)H * sizeof *rail);
        if (!rail) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "shared allreduce: out of memory");
        for (int j = 0; j < H; j++) rail[j] = m->host_ranks[m->host_start[j] + li];
    }
    struct rails rl = {.group = rail, .H = H, .h = h, .algo = LOOMI_ALGO_AUTO, .sbase = dend};

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
        /* The arena's stores stream where the communicator measured that
         * faster (a->stream_copyin); in place, the saves' as above. */
        const uint32_t fl = (ssave ? LOOMI_COPY_STREAM : 0u) |
                            (a->stream_copyin ? (saved ? LOOMI_COPY_STREAM_DST : LOOMI_COPY_STREAM)
                                              : 0u);
        for (int c = 0; c < nc; c++) s->steps[tmp[c]].flags |= fl;
        uint32_t cin = loomi_sched_join(s, tmp, (size_t)nc);
        if (cin == LOOMI_NO_DEP) cin = reuse;
        /* In place: save the rest of this round's input (my slice) before
         * anything overwrites it. */
        uint32_t save = LOOMI_NO_DEP;
        if (saved && !keep)
            save = loomi_sched_copy(s, LOOMI_BUF_SCRATCH, (b + my0) * es, in, (b + my0) * es,
                                    mylen, &cin, 1);

        /* 2. "in" to and from every other rank of the host (the first
         *    round's carry the descriptors). */
        uint32_t *rin = tmp; /* [L] */
        uint32_t last;
        if (k == 0) {
            chk = exchange_desc(s, a, L, li, local, saved, &cin, rin, tmp + L);
            uint32_t d[2] = {chk, cin};
            last = loomi_sched_join(s, d, 2);
        } else {
            sync_host(s, local, L, li, tag + SYNC_IN, cin, rin);
            last = loomi_sched_join(s, rin, (size_t)L);
        }

        /* 3. my slice: my input plus every peer's copy, into my arena,
         *    in one pass once every copy is there. */
        const size_t moff = hoff + my0 * es;
        if (mylen) {
            uint32_t d[2] = {last, reuse};
            last = keep ? loomi_sched_reduce_shared(s, LOOMI_BUF_RECV, (b + my0) * es, in,
                                                    (b + my0) * es, moff, li, mylen, d, 2)
                        : loomi_sched_reduce_shared(s, mine, moff, in, (b + my0) * es, moff, li,
                                                    mylen, d, 2);
            if (keep)
                s->steps[last].flags |= LOOMI_RS_KEEP | (saved ? LOOMI_RS_SAVE : 0) |
                                        ((saved ? ssave : stream) ? LOOMI_RS_STREAM : 0);
        }

        /* 4. rails: the same slice on every host. */
        if (H > 1 && mylen) {
            rc = rail_round(s, a, &rl, R, L, k, mine, moff, mylen, &last);
            if (rc != LOOM_SUCCESS) break;
        }
        if (mylen && s->op == LOOM_AVG && !keep)
            last = loomi_sched_avg(s, mine, moff, mylen, &last, 1);

        /* 5. "red": my slice is final. */
        uint32_t *rred = tmp + L; /* [L] */
        sync_host(s, local, L, li, tag + SYNC_RED, last, rred);

        /* 6. copy-out from each owner's arena (after my copy-in read the
         *    input, which in place is this very RECV range). */
        int no = 0;
        for (int q = 0; q < L; q++) {
            size_t q0 = loomi_seg_start(&g, q), ql = loomi_seg_len(&g, q);
            if (!ql || (keep && q == li)) continue;
            uint32_t d[2] = {rred[q], saved && !keep ? save : cin};
            tmp[no++] = (stream ? loomi_sched_copy_stream : loomi_sched_copy)(
                s, LOOMI_BUF_RECV, (b + q0) * es, LOOMI_BUF_SHARED + q, hoff + q0 * es, ql, d,
                d[1] == LOOMI_NO_DEP ? 1 : 2);
        }
        for (int q = 0; q < L; q++) tmp[no + q] = rred[q]; /* every "red" received */
        uint32_t cout = loomi_sched_join(s, tmp, (size_t)(no + L));

        /* 7. "out": done reading the host's arenas for this round. */
        sync_host(s, local, L, li, tag + SYNC_OUT, cout, tmp);
        outjoin[k % 2] = loomi_sched_join(s, tmp, (size_t)L);
    }
    free(tmp);
    free(rail);
    return rc;
}

/*
 * Reduce-scatter through the arenas, on one host: the first half of the
 * allreduce above, with no copy-out.  Per round, a chunk of every block
 * (C elements of each rank's block, so that the L chunks fill half an
 * arena):
 *
 *   1. copy-in   the chunk of every block but mine into my arena, at the
 *                slot of the block's owner (slot j: local rank j's block);
 *   2. "in"      zero-byte messages to the host's other ranks;
 *   3. reduce    my chunk of RECV = my block's chunk + slot li of every
 *                peer's arena (in place, my block of SEND is RECV: the
 *                pass reads each element before it writes it);
 *   4. "out"     zero-byte messages: I no longer read your arena; the
 *                round two later (same half) waits for them.
 *
 * (Tags as the allreduce's, SYNC_RED unused.)  Each rank copies (L-1)/L
 * of its input once and reads each peer's chunk
 * once, where the ring copies every block it forwards into a FIFO and
 * out again.  In place, the engine's copy of RECV restores it on failure,
 * as for the flat algorithms.  Across hosts, hierarchical; without
 * arenas, the ring.
 */
loom_result_t loomi_gen_reduce_scatter_shared(struct loomi_sched *s,
                                              const struct loomi_coll_args *a)
{
    const size_t count = a->count, es = s->esize;
    const struct loomi_hostmap *m = a->hosts;
    if (count == 0 || s->nranks == 1 || fall_back(s, a, m))
        return loomi_gen_reduce_scatter_ring(s, a);
    if (m->nhosts > 1) return loomi_gen_reduce_scatter_hier(s, a);

    const int me = s->rank, li = m->local_index[me], L = s->nranks;
    const int *local = m->host_ranks + m->host_start[m->host_of[me]];
    const int mine = LOOMI_BUF_SHARED + li;
    s->buf_bytes[LOOMI_BUF_SEND] = (size_t)L * count * es;
    s->buf_bytes[LOOMI_BUF_RECV] = count * es;
    /* Elements per block per round: an L-th of half an arena. */
    const size_t C = round_elems(s, a, L, L);
    const size_t nrounds = (count + C - 1) / C;

    uint32_t *tmp = malloc((size_t)(2 * L) * sizeof *tmp);
    if (!tmp) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "shared reduce_scatter: out of memory");
    uint32_t done[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    for (size_t k = 0; k < nrounds; k++) {
        const size_t b = k * C, len = count - b < C ? count - b : C;
        const size_t hoff = (k % 2) * C * (size_t)L * es;
        const uint32_t tag = (uint32_t)k * SYNC_KINDS;
        /* The half we write was last read by peers two rounds ago. */
        uint32_t reuse = done[k % 2];

        /* 1. copy-in. */
        int nc = 0;
        for (int j = 0; j < L; j++) {
            if (j == li) continue;
            tmp[nc++] = loomi_sched_copy(s, mine, hoff + (size_t)j * C * es, LOOMI_BUF_SEND,
                                         ((size_t)local[j] * count + b) * es, len, &reuse,
                                         reuse == LOOMI_NO_DEP ? 0 : 1);
        }
        const uint32_t cin = loomi_sched_join(s, tmp, (size_t)nc);

        /* 2. "in". */
        uint32_t *rin = tmp; /* [L] */
        sync_host(s, local, L, li, tag + SYNC_IN, cin, rin);
        uint32_t last = loomi_sched_join(s, rin, (size_t)L);

        /* 3. my chunk, from my block and every peer's slot li. */
        uint32_t d[2] = {last, reuse};
        last = loomi_sched_reduce_shared(s, LOOMI_BUF_RECV, b * es, LOOMI_BUF_SEND,
                                         ((size_t)me * count + b) * es,
                                         hoff + (size_t)li * C * es, li, len, d,
                                         reuse == LOOMI_NO_DEP ? 1 : 2);
        if (s->op == LOOM_AVG) last = loomi_sched_avg(s, LOOMI_BUF_RECV, b * es, len, &last, 1);

        /* 4. "out". */
        sync_host(s, local, L, li, tag + SYNC_OUT, last, tmp);
        done[k % 2] = loomi_sched_join(s, tmp, (size_t)L);
    }
    free(tmp);
    return LOOM_SUCCESS;
}

/*
 * Allgather through the arenas, on one host: per round, a chunk of half
 * an arena of my block,
 *
 *   1. copy-in   my block's chunk into my arena;
 *   2. "in"      zero-byte messages to the host's other ranks;
 *   3. copy-out  every peer's chunk from its arena into its place in
 *                RECV (streamed when the host's outputs are too big for
 *                the caches, as the allreduce's copy-out);
 *   4. "out"     zero-byte messages: the round two later may reuse the
 *                half.
 *
 * Out of place my own block goes from SEND to RECV in one copy that
 * waits for nothing.  Each rank copies its block once and the others'
 * once, with user-space copies that may stream; the flat algorithms'
 * transfers over shared memory are copies through a FIFO or the
 * kernel's.  Across hosts, hierarchical; without arenas, the ring.
 *
 * The shared generators open alike on purpose (the fall-backs, then
 * where this rank's host stands) and their rounds end alike ("out",
 * then the join that frees the half): each names its own fall-backs
 * and buffers, and a helper for the few common lines would take more
 * arguments than it saves.
 */
loom_result_t loomi_gen_allgather_shared(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const size_t count = a->count, es = s->esize;
    const struct loomi_hostmap *m = a->hosts;
    if (count == 0 || s->nranks == 1 || fall_back(s, a, m)) return loomi_gen_allgather_ring(s, a);
    if (m->nhosts > 1) return loomi_gen_allgather_hier(s, a);

    const int me = s->rank, li = m->local_index[me], L = s->nranks;
    const int *local = m->host_ranks + m->host_start[m->host_of[me]];
    const int mine = LOOMI_BUF_SHARED + li;
    const int src = a->inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const size_t src0 = a->inplace ? (size_t)me * count * es : 0;
    s->buf_bytes[LOOMI_BUF_SEND] = a->inplace ? 0 : count * es;
    s->buf_bytes[LOOMI_BUF_RECV] = (size_t)L * count * es;
    const size_t C = round_elems(s, a, L, 1), nrounds = (count + C - 1) / C;
    const int stream = loomi_shared_streams(a->stream_bytes, L, (size_t)L * count * es);
    const copy_fn out = stream ? loomi_sched_copy_stream : loomi_sched_copy;
    if (!a->inplace) out(s, LOOMI_BUF_RECV, (size_t)me * count * es, LOOMI_BUF_SEND, 0, count,
                         NULL, 0);

    uint32_t *tmp = malloc((size_t)(2 * L) * sizeof *tmp);
    if (!tmp) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "shared allgather: out of memory");
    uint32_t done[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    for (size_t k = 0; k < nrounds; k++) {
        const size_t b = k * C, len = count - b < C ? count - b : C;
        const size_t hoff = (k % 2) * C * es;
        const uint32_t tag = (uint32_t)k * SYNC_KINDS;
        /* The half we write was last read by peers two rounds ago. */
        uint32_t reuse = done[k % 2];

        /* 1. copy-in. */
        const uint32_t cin = loomi_sched_copy(s, mine, hoff, src, src0 + b * es, len, &reuse,
                                              reuse == LOOMI_NO_DEP ? 0 : 1);
        /* 2. "in". */
        uint32_t *rin = tmp; /* [L] */
        sync_host(s, local, L, li, tag + SYNC_IN, cin, rin);
        /* 3. copy-out of every peer's chunk once it is there. */
        uint32_t *cout = tmp + L; /* [L] */
        int no = 0;
        for (int q = 0; q < L; q++) {
            if (q == li) continue;
            cout[no++] = out(s, LOOMI_BUF_RECV, ((size_t)local[q] * count + b) * es,
                             LOOMI_BUF_SHARED + q, hoff, len, &rin[q], 1);
        }
        const uint32_t last = loomi_sched_join(s, cout, (size_t)no);
        /* 4. "out". */
        sync_host(s, local, L, li, tag + SYNC_OUT, last, tmp);
        done[k % 2] = loomi_sched_join(s, tmp, (size_t)L);
    }
    free(tmp);
    return LOOM_SUCCESS;
}

/*
 * Broadcast through the root's arena, on one host: per round of half an
 * arena, the root copies the chunk into its arena (and, out of place,
 * its RECV in the same pass) and tells the host's other ranks ("in");
 * each copies it out into RECV (streamed as loomi_bcast_streams() says)
 * and tells the root ("out"), which may then reuse the half two rounds
 * later.  Every rank copies the data once, where the
 * flat algorithms move it through FIFOs or the kernel.  Across hosts,
 * hierarchical; without arenas, or with a root outside the job (which
 * the tree reports), the tree.
 */
loom_result_t loomi_gen_broadcast_shared(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const size_t count = a->count, es = s->esize;
    const struct loomi_hostmap *m = a->hosts;
    if (a->root < 0 || a->root >= s->nranks || count == 0 || s->nranks == 1 ||
        fall_back(s, a, m))
        return loomi_gen_broadcast_tree(s, a);
    if (m->nhosts > 1) return loomi_gen_broadcast_hier(s, a);

    const int me = s->rank, L = s->nranks, rl = m->local_index[a->root];
    const int *local = m->host_ranks + m->host_start[m->host_of[me]];
    const int isroot = me == a->root, copy = isroot && !a->inplace;
    const int src = copy ? LOOMI_BUF_SEND : LOOMI_BUF_RECV;
    const int arena = LOOMI_BUF_SHARED + rl;
    s->buf_bytes[LOOMI_BUF_SEND] = copy ? count * es : 0;
    s->buf_bytes[LOOMI_BUF_RECV] = count * es;
    const size_t C = round_elems(s, a, L, 1), nrounds = (count + C - 1) / C;
    const int stream = loomi_bcast_streams(a->stream_bytes, L, count * es);
    const copy_fn out = stream ? loomi_sched_copy_stream : loomi_sched_copy;

    uint32_t *tmp = malloc((size_t)L * sizeof *tmp);
    if (!tmp) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "shared broadcast: out of memory");
    uint32_t done[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    for (size_t k = 0; k < nrounds; k++) {
        const size_t b = k * C, len = count - b < C ? count - b : C;
        const size_t hoff = (k % 2) * C * es;
        const uint32_t tag = (uint32_t)k * SYNC_KINDS;
        if (isroot) {
            /* The half we write was last read two rounds ago. */
            uint32_t reuse = done[k % 2];
            /* Out of place, the same pass fills my RECV (streamed as
             * the others' copies out): SEND is read once. */
            const int nr = reuse == LOOMI_NO_DEP ? 0 : 1;
            const uint32_t cin =
                copy ? loomi_sched_copy2(s, arena, hoff, LOOMI_BUF_RECV, b * es, src, b * es, len,
                                         &reuse, nr)
                     : loomi_sched_copy(s, arena, hoff, src, b * es, len, &reuse, nr);
            if (copy && stream) s->steps[cin].flags |= LOOMI_COPY_STREAM;
            int nd = 0;
            tmp[nd++] = cin;
            for (int q = 0; q < L; q++) {
                if (q == rl) continue;
                loomi_sched_send(s, local[q], tag + SYNC_IN, LOOMI_BUF_RECV, 0, 0, &cin, 1);
                tmp[nd++] = loomi_sched_recv(s, local[q], tag + SYNC_OUT, LOOMI_BUF_RECV, 0,
                                             0, NULL, 0);
            }
            done[k % 2] = loomi_sched_join(s, tmp, (size_t)nd);
        } else {
            const uint32_t got = loomi_sched_recv(s, a->root, tag + SYNC_IN, LOOMI_BUF_RECV,
                                                  0, 0, NULL, 0);
            const uint32_t c = out(s, LOOMI_BUF_RECV, b * es, arena, hoff, len, &got, 1);
            loomi_sched_send(s, a->root, tag + SYNC_OUT, LOOMI_BUF_RECV, 0, 0, &c, 1);
        }
    }
    free(tmp);
    return LOOM_SUCCESS;
}
