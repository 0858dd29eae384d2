/*
 * local.c - the steps an operation runs on this rank alone: reductions,
 * copies and averages (over the operation's buffers and the host's shared
 * arenas), encodes and decodes (compressed schedules), the comparison of
 * a peer's descriptor (EXPECT), and putting the caller's bytes back after
 * a failure.
 */
#include <stdio.h>
#include <string.h>

#include "compress/compress.h"
#include "core/cuda.h"
#include "reduce/reduce.h"
#include "sched/copy.h"
#include "sched/op.h"

/* An encode or decode step (compressed schedules; see sched.h for the
 * slot format).  A failure (a malformed encoding from a peer, a codec
 * error) fails the operation. */
loom_result_t loomi_op_run_codec(struct loomi_op *op, const struct loomi_step *st)
{
    const struct loomi_sched *s = &op->s;
    const loom_codec_t *cd = s->codec;
    const size_t sb = loomi_codec_slot_bytes(cd, st->count);
    loom_result_t r;
    const char *what;
    if (st->kind == LOOMI_STEP_ENCODE) {
        const float *x = (const float *)(void *)(bufp(op, st->src) + st->src_off);
        unsigned char *slot = bufp(op, st->dst) + st->dst_off;
        float *dec = (st->flags & LOOMI_ENC_DECODED)
                         ? (float *)(void *)(bufp(op, st->src2) + st->src2_off)
                         : NULL;
        size_t len = 0;
        what = "encoding";
        if (st->flags & LOOMI_ENC_EF)
            r = loom_codec_encode_ef(cd, s->ef_state, s->ef_key, s->ef_count,
                                     (st->src_off - s->ef_base) / s->esize, x, st->count, slot + 8, sb - 8,
                                     &len, dec);
        else
            r = loom_codec_encode(cd, x, st->count, slot + 8, sb - 8, &len, dec);
        if (r == LOOM_SUCCESS) {
            loomi_le64_store(slot, (uint64_t)len);
            memset(slot + 8 + len, 0, sb - 8 - len);
        }
    } else {
        const unsigned char *slot = bufp(op, st->src) + st->src_off;
        float *dst = (float *)(void *)(bufp(op, st->dst) + st->dst_off);
        uint64_t len = loomi_le64_load(slot);
        what = "decoding";
        if (len > sb - 8) {
            r = loomi_fail(LOOM_ERR_REMOTE, *op->eng->rank,
                           "an encoded chunk of %zu values announces %llu bytes; codec %s "
                           "makes at most %zu",
                           st->count, (unsigned long long)len, cd->name, sb - 8);
        } else if (st->kind == LOOMI_STEP_DECODE) {
            r = loom_codec_decode(cd, slot + 8, (size_t)len, dst, st->count);
        } else {
            const unsigned char *base = bufp(op, st->src2) + st->src2_off;
            if (base != (const unsigned char *)dst)
                memcpy(dst, base, st->count * sizeof(float));
            r = loom_codec_decode_accumulate(cd, slot + 8, (size_t)len, dst, st->count);
        }
    }
    if (r != LOOM_SUCCESS && op->status == LOOM_SUCCESS) {
        op->status = r;
        op->failed_peer = -1;
        snprintf(op->errmsg, sizeof op->errmsg, "%s %zu values with codec %s failed: %s", what,
                 st->count, cd->name, loom_get_last_error());
    }
    return r;
}

/* A peer runs this operation otherwise than this rank (LOOMI_STEP_EXPECT
 * on the descriptors of shared.c): say how, from both descriptors. */
void loomi_op_expect_failed(struct loomi_op *op, const struct loomi_step *st)
{
    uint64_t mine[4] = {0}, theirs[4] = {0};
    size_t n = st->count * op->s.esize;
    if (n > sizeof mine) n = sizeof mine;
    memcpy(mine, bufp(op, st->src) + st->src_off, n);
    memcpy(theirs, bufp(op, st->src2) + st->src2_off, n);
    op->status = LOOM_ERR_MISMATCH;
    op->failed_peer = -1;
    if (!mine[0] != !theirs[0])
        snprintf(op->errmsg, sizeof op->errmsg,
                 "rank %d's buffers are%s in a loom_mem_alloc window and this rank's are%s: "
                 "every rank of a host must use windows alike",
                 st->peer, theirs[0] ? "" : " not", mine[0] ? "" : " not");
    else
        snprintf(op->errmsg, sizeof op->errmsg,
                 "rank %d's buffers are at other places of its loom_mem_alloc window than "
                 "this rank's (window %llu, send offset %llu, receive offset %llu here; window "
                 "%llu, %llu, %llu there): windows are symmetric, every rank must pass the same "
                 "offsets",
                 st->peer, (unsigned long long)mine[1], (unsigned long long)mine[2],
                 (unsigned long long)mine[3], (unsigned long long)theirs[1],
                 (unsigned long long)theirs[2], (unsigned long long)theirs[3]);
}

/* A failed saves_input operation: put back, from SCRATCH, each range of
 * RECV that a step already started wrote (or was receiving into).  The
 * schedule saved every such range before that step could start. */
void loomi_op_restore_written(struct loomi_op *op)
{
    const struct loomi_sched *s = &op->s;
    const unsigned char *saved = op->bufs[LOOMI_BUF_SCRATCH];
    for (uint32_t k = 0; k < op->rhead; k++) {
        const struct loomi_step *st = &s->steps[op->ready[k]];
        if (st->kind == LOOMI_STEP_SEND || st->dst != LOOMI_BUF_RECV || !st->count) continue;
        size_t len = st->count * s->esize;
        if (st->dst_off > op->inplace_len || len > op->inplace_len - st->dst_off) continue;
        memcpy((unsigned char *)op->inplace_buf + st->dst_off, saved + st->dst_off, len);
    }
}

/* A REDUCE_SHARED step's block of k elements from element o: out = the
 * step's source block (a) OP every other arena's (all but st->peer, at
 * src2_off), one pass per arena over a block that stays in cache.  out
 * may be a's block. */
static void reduce_arenas(const struct loomi_op *op, const struct loomi_step *st,
                          unsigned char *out, size_t o, size_t k)
{
    const struct loomi_sched *s = &op->s;
    const size_t es = s->esize;
    const unsigned char *a = bufp(op, st->src) + st->src_off;
    int first = 1;
    for (int i = 0; i < s->nshared; i++) {
        if (i == st->peer) continue;
        loomi_reduce_out(out, first ? a + o * es : out, op->shared[i] + st->src2_off + o * es,
                         k, s->dtype, s->op);
        first = 0;
    }
}

/* The blocks reduce_push produces in L1 and writes out at once: small,
 * so that the loads of the next block and the stores of this one overlap
 * in the core (1K blocks were much faster than 16K, about as fast as one
 * fused loop).  The staged forms keep 16K blocks: there, blocks of 2K or
 * less made the whole allreduce much slower at medium sizes (4K and up
 * did not), which the memory traffic does not explain; and the in-place
 * save gained nothing that stood out of the noise (perf/NOTES.md,
 * "local.c, block sizes"). */
#define PUT_BLOCK 1024
#define KEEP_BLOCK 16384

/* REDUCE_SHARED with LOOMI_RS_PUSH: each block is reduced in a buffer
 * that stays in L1, then written to dst and to every other rank's window
 * at the same place: every byte of the result is written once per rank
 * and read by nobody, so with LOOMI_RS_STREAM the stores skip the cache
 * and the read of each line they overwrite. */
static void reduce_push(struct loomi_op *op, const struct loomi_step *st)
{
    const struct loomi_sched *s = &op->s;
    const size_t es = s->esize, blk = PUT_BLOCK / es;
    _Alignas(64) unsigned char tmp[PUT_BLOCK];
    unsigned char *d = bufp(op, st->dst) + st->dst_off;
    const int nt = (st->flags & LOOMI_RS_STREAM) != 0;
    for (size_t o = 0; o < st->count; o += blk) {
        size_t k = st->count - o < blk ? st->count - o : blk;
        reduce_arenas(op, st, tmp, o, k);
        if (s->op == LOOM_AVG) loomi_reduce_finish_avg(tmp, k, s->dtype, s->nranks);
        for (int i = 0; i < s->nshared; i++) {
            unsigned char *to = i == st->peer
                                    ? d + o * es
                                    : op->shared[i] + s->win_push_off + st->dst_off + o * es;
            loomi_copy_put_block(to, tmp, k * es, nt);
        }
    }
    loomi_copy_fence(nt);
}

/* REDUCE_SHARED with LOOMI_RS_KEEP: as reduce_push, each block is
 * reduced in L1, then (in place) the old block is saved, and the result
 * goes to dst and to this rank's own arena, where the others copy it.
 * It repeats reduce_push's opening on purpose: the two loops are the hot
 * path of the shared allreduce and are tuned each on its own. */
static void reduce_keep(struct loomi_op *op, const struct loomi_step *st)
{
    const struct loomi_sched *s = &op->s;
    const size_t es = s->esize, blk = KEEP_BLOCK / es;
    _Alignas(64) unsigned char tmp[KEEP_BLOCK];
    unsigned char *d = bufp(op, st->dst) + st->dst_off;
    unsigned char *keep = op->shared[st->peer] + st->src2_off;
    unsigned char *save = (st->flags & LOOMI_RS_SAVE)
                              ? op->bufs[LOOMI_BUF_SCRATCH] + st->dst_off
                              : NULL;
    const int nt = (st->flags & LOOMI_RS_STREAM) != 0;
    for (size_t o = 0; o < st->count; o += blk) {
        size_t k = st->count - o < blk ? st->count - o : blk;
        reduce_arenas(op, st, tmp, o, k);
        if (s->op == LOOM_AVG) loomi_reduce_finish_avg(tmp, k, s->dtype, s->nranks);
        if (save && nt) loomi_copy_stream_nf(save + o * es, NULL, d + o * es, k * es, 0);
        else if (save) memcpy(save + o * es, d + o * es, k * es);
        memcpy(keep + o * es, tmp, k * es);
        if (nt && !save) loomi_copy_stream_nf(d + o * es, NULL, tmp, k * es, 0);
        else memcpy(d + o * es, tmp, k * es);
    }
    loomi_copy_fence(nt);
}

/* A copy step of a schedule on device buffers (GPUDirect): every copy
 * through the driver (either side may be device memory); a failure
 * fails the operation. */
static void copy_dev(struct loomi_op *op, const struct loomi_step *st, size_t bytes)
{
    unsigned char *dst = bufp(op, st->dst) + st->dst_off;
    const unsigned char *src = bufp(op, st->src) + st->src_off;
    unsigned char *src2 = (st->flags & (LOOMI_COPY_SAVE | LOOMI_COPY_ALSO))
                              ? bufp(op, st->src2) + st->src2_off
                              : NULL;
    char why[160];
    int bad = 0;
    if (st->flags & LOOMI_COPY_SAVE) bad = loomi_cuda_copy(src2, dst, bytes, why, sizeof why);
    if (!bad && dst != src) bad = loomi_cuda_copy(dst, src, bytes, why, sizeof why);
    if (!bad && (st->flags & LOOMI_COPY_ALSO) && !(st->flags & LOOMI_COPY_SAVE))
        bad = loomi_cuda_copy(src2, src, bytes, why, sizeof why);
    if (bad && op->status == LOOM_SUCCESS) {
        op->status = LOOM_ERR_SYSTEM;
        snprintf(op->errmsg, sizeof op->errmsg, "a copy on device buffers failed: %s", why);
    }
}

/* A reduce, copy or avg step on at least one element. */
void loomi_op_run_local(struct loomi_op *op, const struct loomi_step *st, size_t bytes)
{
    const struct loomi_sched *s = &op->s;
    switch (st->kind) {
    case LOOMI_STEP_REDUCE:
        loomi_reduce_out(bufp(op, st->dst) + st->dst_off, bufp(op, st->src) + st->src_off,
                         bufp(op, st->src2) + st->src2_off, st->count, s->dtype, s->op);
        break;
    case LOOMI_STEP_COPY:
        if (s->dev) {
            copy_dev(op, st, bytes);
            break;
        }
        if (st->flags & LOOMI_COPY_SAVE)
            loomi_copy_save(bufp(op, st->dst) + st->dst_off, bufp(op, st->src2) + st->src2_off,
                      bufp(op, st->src) + st->src_off, bytes, (st->flags & LOOMI_COPY_STREAM) != 0);
        else if ((st->flags & LOOMI_COPY_ALSO) && (st->flags & LOOMI_COPY_STREAM))
            /* the second destination is the saved input */
            loomi_copy_stream(bufp(op, st->src2) + st->src2_off, bufp(op, st->dst) + st->dst_off,
                        bufp(op, st->src) + st->src_off, bytes,
                        (st->flags & LOOMI_COPY_STREAM_DST) != 0);
        else if ((st->flags & LOOMI_COPY_ALSO) && (st->flags & LOOMI_COPY_STREAM_DST))
            loomi_copy_stream(bufp(op, st->dst) + st->dst_off, bufp(op, st->src2) + st->src2_off,
                        bufp(op, st->src) + st->src_off, bytes, 0);
        else if (st->flags & LOOMI_COPY_ALSO) {
            memcpy(bufp(op, st->dst) + st->dst_off, bufp(op, st->src) + st->src_off, bytes);
            memcpy(bufp(op, st->src2) + st->src2_off, bufp(op, st->src) + st->src_off, bytes);
        }
        else if ((st->flags & LOOMI_COPY_STREAM) ||
                 (s->saves_input && st->dst == LOOMI_BUF_SCRATCH && st->src == LOOMI_BUF_RECV))
            loomi_copy_stream(bufp(op, st->dst) + st->dst_off, NULL, bufp(op, st->src) + st->src_off,
                        bytes, 0);
        else if (bufp(op, st->dst) + st->dst_off != bufp(op, st->src) + st->src_off)
            memcpy(bufp(op, st->dst) + st->dst_off, bufp(op, st->src) + st->src_off, bytes);
        break;
    case LOOMI_STEP_REDUCE_SHARED: {
        if (st->flags & LOOMI_RS_PUSH) {
            reduce_push(op, st);
            break;
        }
        if (st->flags & LOOMI_RS_KEEP) {
            reduce_keep(op, st);
            break;
        }
        /* Block by block, so that the partial result stays in cache while
         * each arena's operand streams past it once. */
        unsigned char *d = bufp(op, st->dst) + st->dst_off;
        unsigned char *save = (st->flags & LOOMI_RS_SAVE)
                                  ? op->bufs[LOOMI_BUF_SCRATCH] + st->dst_off
                                  : NULL;
        const size_t es = s->esize, blk = KEEP_BLOCK / es;
        for (size_t o = 0; o < st->count; o += blk) {
            size_t k = st->count - o < blk ? st->count - o : blk;
            /* The old block, about to be overwritten; the reduction then
             * reads it from cache. */
            if (save && (st->flags & LOOMI_RS_STREAM))
                loomi_copy_stream_nf(save + o * es, NULL, d + o * es, k * es, 0);
            else if (save)
                memcpy(save + o * es, d + o * es, k * es);
            reduce_arenas(op, st, d + o * es, o, k);
        }
        loomi_copy_fence(save && (st->flags & LOOMI_RS_STREAM));
        break;
    }
    case LOOMI_STEP_AVG:
        loomi_reduce_finish_avg(bufp(op, st->dst) + st->dst_off, st->count, s->dtype,
                                st->flags ? (int)st->flags : s->nranks);
        break;
    }
}
