/*
 * compressed.c - collectives whose traffic goes through a codec
 * (loom-codecs(7), DESIGN.md §5): schedules with ENCODE / DECODE /
 * DECODE_ACC steps (sched.h), run by the ordinary engine.
 *
 * Encoded chunks travel in "slots" of loomi_codec_slot_bytes(codec, n)
 * bytes (a u64 length, the encoding, zero padding), which both sides can
 * size from the chunk's element count alone.
 *
 * Allreduce, additive and decode-reduce codecs (bf16, fp16, int8, int4,
 * fp4): a ring.  Reduce-scatter step k: rank r sends the encoding of its
 * partial of segment r-k and receives that of segment r-k-1, which it
 * decodes and adds (in fp32) to its own contribution; the sum is encoded
 * again for the next hop.  After p-1 steps rank r holds the sum of
 * segment r+1: it divides it (AVG), encodes it once and writes the
 * decoded values back to its own recvbuf.  The allgather phase forwards
 * those bytes unchanged and every receiver decodes them, so every rank
 * ends with identical bytes.  (Additive codecs are decoded and re-encoded
 * per hop too: the same precision as summing on the wire.)
 *
 * Allreduce, gather-only codecs (topk): every rank encodes its own input,
 * the encodings are all-gathered over the ring, and every rank decodes
 * them in rank order (0, 1, ...) into recvbuf, then divides (AVG): the
 * same operations in the same order on every rank, identical bytes.
 *
 * Error feedback (s->ef_state): each rank encodes its own input once per
 * element with loom_codec_encode_ef and uses the decoded values as its
 * contribution, so the residual is exactly what compression lost of this
 * rank's input; the engine commits it when the operation succeeds and
 * rolls it back when it fails.
 *
 * Every phase is cut into chunks with per-chunk dependencies, so encode,
 * transfer and decode of different chunks overlap.
 */
#include <stdlib.h>

#include "coll/build.h"
#include "coll/coll.h"
#include "compress/compress.h"
#include "core/internal.h"

static uint32_t *ids(size_t n)
{
    uint32_t *a = malloc((n ? n : 1) * sizeof *a);
    if (a)
        for (size_t i = 0; i < n; i++) a[i] = LOOMI_NO_DEP;
    return a;
}

/* Elements of a slot of n values, as SEND/RECV counts (esize 4). */
static size_t slot_elems(const struct loomi_sched *s, size_t n)
{
    return loomi_codec_slot_bytes(s->codec, n) / s->esize;
}

static loom_result_t setup(struct loomi_sched *s, const struct loomi_cz *z, size_t ef_count,
                           size_t ef_base)
{
    s->codec = z->codec;
    if (z->state) {
        s->ef_state = z->state;
        s->ef_key = z->key;
        s->ef_count = ef_count;
        s->ef_base = ef_base;
    }
    if (s->dtype != LOOM_FLOAT32)
        return loomi_fail(LOOM_ERR_INTERNAL, s->rank, "compressed schedule for a non-fp32 type");
    return LOOM_SUCCESS;
}

/* Slot size for chunks of up to maxn values (0: too large). */
static loom_result_t slot_size(const struct loomi_sched *s, size_t maxn, size_t *sb)
{
    *sb = loomi_codec_slot_bytes(s->codec, maxn ? maxn : 1);
    if (!*sb)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, s->rank,
                          "codec %s cannot encode chunks of %zu values", s->codec->name, maxn);
    return LOOM_SUCCESS;
}

/* The chunks *C of the longest piece (maxn elements), their slot size,
 * as slot_size, and room for per_chunk slots of each chunk (allreduce). */
static loom_result_t allreduce_slots(const struct loomi_sched *s, size_t maxn, size_t chunk_bytes,
                                     size_t per_chunk, size_t *C, size_t *sb)
{
    *C = loomi_build_chunks(maxn * s->esize, chunk_bytes);
    const size_t nslots = per_chunk * *C;
    loom_result_t rc = slot_size(s, (maxn + *C - 1) / *C, sb);
    if (rc == LOOM_SUCCESS && nslots > SIZE_MAX / *sb)
        rc = loomi_fail(LOOM_ERR_INVALID_ARGUMENT, s->rank, "compressed allreduce: too large");
    return rc;
}

/* The ring that passes every rank's encoded chunks round, in slot q*C+c
 * of SCRATCH (slot size sb): step k forwards rank r-k's chunks to the
 * right and receives rank r-k-1's from the left, each when arr[q*C+c]
 * says it is there, and sets it for what arrives.  With decode (the
 * allgather), each chunk that arrives is decoded into its place in RECV. */
static void ring_pass(struct loomi_sched *s, size_t count, size_t C, size_t sb, uint32_t *arr,
                      int decode)
{
    const int p = s->nranks, r = s->rank;
    const int right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
    for (int k = 0; k < p - 1; k++) {
        int sq = loomi_mod(r - k, p), rq = loomi_mod(r - k - 1, p);
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            loomi_chunk(count, C, c, &o, &n);
            if (!n) continue;
            uint32_t tag = (uint32_t)((size_t)k * C + c);
            loomi_sched_send(s, right, tag, LOOMI_BUF_SCRATCH, ((size_t)sq * C + c) * sb,
                             slot_elems(s, n), &arr[(size_t)sq * C + c], 1);
            uint32_t rv = loomi_sched_recv(s, left, tag, LOOMI_BUF_SCRATCH,
                                           ((size_t)rq * C + c) * sb, slot_elems(s, n), NULL, 0);
            arr[(size_t)rq * C + c] = rv;
            if (decode)
                loomi_sched_decode(s, LOOMI_BUF_RECV, ((size_t)rq * count + o) * s->esize,
                                   LOOMI_BUF_SCRATCH, ((size_t)rq * C + c) * sb, n, &rv, 1);
        }
    }
}

/* ------------------------------------------------ gather-only allreduce */

static loom_result_t allreduce_gather(struct loomi_sched *s, size_t count, int inplace,
                                      size_t chunk_bytes, unsigned ef)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize;
    const int src = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    size_t C, sb;
    loom_result_t rc = allreduce_slots(s, count, chunk_bytes, (size_t)p, &C, &sb);
    if (rc != LOOM_SUCCESS) return rc;
    s->buf_bytes[LOOMI_BUF_SCRATCH] = (size_t)p * C * sb;
    uint32_t *arr = ids((size_t)p * C); /* arrival of rank q's chunk c */
    if (!arr) return loomi_fail(LOOM_ERR_NO_MEMORY, r, "compressed allreduce: out of memory");
#define SLOT(q, c) (((size_t)(q) * C + (c)) * sb)
    for (size_t c = 0; c < C; c++) {
        size_t o, n;
        loomi_chunk(count, C, c, &o, &n);
        if (!n) continue;
        arr[(size_t)r * C + c] = loomi_sched_encode(s, LOOMI_BUF_SCRATCH, SLOT(r, c), src, o * es,
                                                    n, ef, 0, 0, NULL, 0);
    }
    ring_pass(s, count, C, sb, arr, 0);
    for (size_t c = 0; c < C; c++) {
        size_t o, n;
        loomi_chunk(count, C, c, &o, &n);
        if (!n) continue;
        /* In place, the first decode overwrites the input the own encode
         * reads: it waits for it (arr[r] is that encode). */
        uint32_t prev = arr[(size_t)r * C + c];
        for (int q = 0; q < p; q++) {
            uint32_t d[2] = {prev, arr[(size_t)q * C + c]};
            prev = q ? loomi_sched_decode_acc(s, LOOMI_BUF_RECV, o * es, LOOMI_BUF_RECV, o * es,
                                              LOOMI_BUF_SCRATCH, SLOT(q, c), n, d, 2)
                     : loomi_sched_decode(s, LOOMI_BUF_RECV, o * es, LOOMI_BUF_SCRATCH,
                                          SLOT(q, c), n, d, 2);
        }
        if (s->op == LOOM_AVG) loomi_sched_avg(s, LOOMI_BUF_RECV, o * es, n, &prev, 1);
    }
#undef SLOT
    free(arr);
    return LOOM_SUCCESS;
}

/* ---------------------------------------------- decode-reduce allreduce */

static loom_result_t allreduce_ring(struct loomi_sched *s, size_t count, int inplace,
                                    size_t chunk_bytes, unsigned ef)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize;
    struct loomi_seg g = loomi_seg_make(count, p);
    const int src = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const int right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
    size_t C, sb;
    loom_result_t rc = allreduce_slots(s, loomi_seg_len(&g, 0), chunk_bytes, (size_t)p + 4, &C,
                                       &sb);
    if (rc != LOOM_SUCCESS) return rc;
    /* Scratch: RS send slots [2][C], RS receive slots [2][C], then one
     * slot per (segment, chunk) for the allgather (and the bytes of the
     * error-feedback encodes, which are not sent). */
    const size_t send0 = 0, recv0 = 2 * C * sb, ag0 = 4 * C * sb;
    s->buf_bytes[LOOMI_BUF_SCRATCH] = ag0 + (size_t)p * C * sb;
#define SSLOT(b, c) (send0 + ((size_t)(b) * C + (c)) * sb)
#define RSLOT(b, c) (recv0 + ((size_t)(b) * C + (c)) * sb)
#define ASLOT(x, c) (ag0 + ((size_t)(x) * C + (c)) * sb)
#define OFF(x, o) ((loomi_seg_start(&g, (x)) + (o)) * es)
    const size_t pc = (size_t)p * C;
    uint32_t *efs = ids(pc), *last = ids(pc), *sguard = ids(2 * C), *rguard = ids(2 * C),
             *enc = ids(C), *agprev = ids(C);
    if (!efs || !last || !sguard || !rguard || !enc || !agprev) {
        free(efs), free(last), free(sguard), free(rguard), free(enc), free(agprev);
        return loomi_fail(LOOM_ERR_NO_MEMORY, r, "compressed allreduce: out of memory");
    }
    /* Error feedback: the own contribution to every segment received in
     * the reduce-scatter, encoded with its residual and decoded into
     * RECV (its bytes land in the segment's allgather slot, unsent). */
    if (ef)
        for (int x = 0; x < p; x++) {
            if (x == r) continue;
            for (size_t c = 0; c < C; c++) {
                size_t o, n;
                loomi_chunk(loomi_seg_len(&g, x), C, c, &o, &n);
                if (!n) continue;
                efs[(size_t)x * C + c] = last[(size_t)x * C + c] = loomi_sched_encode(
                    s, LOOMI_BUF_SCRATCH, ASLOT(x, c), src, OFF(x, o), n,
                    LOOMI_ENC_EF | LOOMI_ENC_DECODED, LOOMI_BUF_RECV, OFF(x, o), NULL, 0);
            }
        }
    for (int k = 0; k < p - 1; k++) {
        int ss = loomi_mod(r - k, p), rs = loomi_mod(r - k - 1, p);
        size_t b = (size_t)(k & 1), nb = (size_t)((k + 1) & 1);
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            uint32_t tag = (uint32_t)((size_t)k * C + c);
            loomi_chunk(loomi_seg_len(&g, ss), C, c, &o, &n);
            if (n) {
                if (k == 0) /* the own input of segment r, encoded straight */
                    enc[c] = last[(size_t)ss * C + c] = loomi_sched_encode(
                        s, LOOMI_BUF_SCRATCH, SSLOT(b, c), src, OFF(ss, o), n, ef, 0, 0, NULL, 0);
                sguard[b * C + c] = loomi_sched_send(s, right, tag, LOOMI_BUF_SCRATCH, SSLOT(b, c),
                                                     slot_elems(s, n), &enc[c], 1);
            }
            loomi_chunk(loomi_seg_len(&g, rs), C, c, &o, &n);
            if (!n) continue;
            uint32_t rv = loomi_sched_recv(s, left, tag, LOOMI_BUF_SCRATCH, RSLOT(b, c),
                                           slot_elems(s, n), &rguard[b * C + c], 1);
            uint32_t d[2] = {rv, efs[(size_t)rs * C + c]};
            /* RECV = own contribution (SEND, or already in RECV) + decoded */
            uint32_t da = loomi_sched_decode_acc(s, LOOMI_BUF_RECV, OFF(rs, o),
                                                 ef ? LOOMI_BUF_RECV : src, OFF(rs, o),
                                                 LOOMI_BUF_SCRATCH, RSLOT(b, c), n, d, 2);
            rguard[b * C + c] = da;
            if (k < p - 2) {
                uint32_t d2[2] = {da, sguard[nb * C + c]};
                enc[c] = loomi_sched_encode(s, LOOMI_BUF_SCRATCH, SSLOT(nb, c), LOOMI_BUF_RECV,
                                            OFF(rs, o), n, 0, 0, 0, d2, 2);
                last[(size_t)rs * C + c] = enc[c];
            } else {
                /* rs is r+1: this rank owns its final value. */
                uint32_t fin = da;
                if (s->op == LOOM_AVG) fin = loomi_sched_avg(s, LOOMI_BUF_RECV, OFF(rs, o), n, &da, 1);
                agprev[c] = last[(size_t)rs * C + c] = loomi_sched_encode(
                    s, LOOMI_BUF_SCRATCH, ASLOT(rs, c), LOOMI_BUF_RECV, OFF(rs, o), n,
                    LOOMI_ENC_DECODED, LOOMI_BUF_RECV, OFF(rs, o), &fin, 1);
            }
        }
    }
    const int own = loomi_mod(r + 1, p);
    const uint32_t tag0 = (uint32_t)((size_t)(p - 1) * C);
    for (int k = 0; k < p - 1; k++) {
        int ss = loomi_mod(own - k, p), rs = loomi_mod(own - k - 1, p);
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            uint32_t tag = tag0 + (uint32_t)((size_t)k * C + c);
            loomi_chunk(loomi_seg_len(&g, ss), C, c, &o, &n);
            if (n)
                loomi_sched_send(s, right, tag, LOOMI_BUF_SCRATCH, ASLOT(ss, c), slot_elems(s, n),
                                 &agprev[c], 1);
            loomi_chunk(loomi_seg_len(&g, rs), C, c, &o, &n);
            agprev[c] = LOOMI_NO_DEP;
            if (!n) continue;
            uint32_t rv = loomi_sched_recv(s, left, tag, LOOMI_BUF_SCRATCH, ASLOT(rs, c),
                                           slot_elems(s, n), &efs[(size_t)rs * C + c], 1);
            uint32_t d[2] = {rv, last[(size_t)rs * C + c]};
            loomi_sched_decode(s, LOOMI_BUF_RECV, OFF(rs, o), LOOMI_BUF_SCRATCH, ASLOT(rs, c), n,
                               d, 2);
            agprev[c] = rv; /* forwarded as received */
        }
    }
#undef SSLOT
#undef RSLOT
#undef ASLOT
#undef OFF
    free(efs), free(last), free(sguard), free(rguard), free(enc), free(agprev);
    return LOOM_SUCCESS;
}

loom_result_t loomi_gen_allreduce_cz(struct loomi_sched *s, const struct loomi_coll_args *a,
                                     const struct loomi_cz *z)
{
    loom_result_t rc = setup(s, z, a->count, 0);
    if (rc != LOOM_SUCCESS) return rc;
    /* One rank: nothing travels, the result is exact. */
    if (loomi_allreduce_trivial(s, a->count, a->inplace)) return LOOM_SUCCESS;
    unsigned ef = z->state ? LOOMI_ENC_EF : 0;
    if (loomi_codec_kind(z->codec) == LOOM_CODEC_GATHER_ONLY)
        return allreduce_gather(s, a->count, a->inplace, a->chunk_bytes, ef);
    return allreduce_ring(s, a->count, a->inplace, a->chunk_bytes, ef);
}

/* ------------------------------------------------------- allgather */

/* Each rank encodes its block once (writing the decoded values to its
 * own block of recvbuf), the encodings go round the ring unchanged, and
 * each rank decodes the others' into their blocks. */
loom_result_t loomi_gen_allgather_cz(struct loomi_sched *s, const struct loomi_coll_args *a,
                                     const struct loomi_cz *z)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize, count = a->count;
    const size_t own_off = (size_t)r * count * es;
    loom_result_t rc = setup(s, z, count, a->inplace ? own_off : 0);
    if (rc != LOOM_SUCCESS) return rc;
    s->buf_bytes[LOOMI_BUF_SEND] = a->inplace ? 0 : count * es;
    s->buf_bytes[LOOMI_BUF_RECV] = (size_t)p * count * es;
    if (count == 0) return LOOM_SUCCESS;
    if (p == 1) {
        if (!a->inplace) loomi_sched_copy(s, LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, count, NULL, 0);
        return LOOM_SUCCESS;
    }
    const int src = a->inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const size_t src0 = a->inplace ? own_off : 0;
    unsigned ef = z->state ? LOOMI_ENC_EF : 0;
    size_t C = loomi_build_chunks(count * es, a->chunk_bytes), sb;
    if ((rc = slot_size(s, (count + C - 1) / C, &sb)) != LOOM_SUCCESS) return rc;
    if ((size_t)p * C > SIZE_MAX / sb)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, r, "compressed allgather: too large");
    s->buf_bytes[LOOMI_BUF_SCRATCH] = (size_t)p * C * sb;
    uint32_t *arr = ids((size_t)p * C);
    if (!arr) return loomi_fail(LOOM_ERR_NO_MEMORY, r, "compressed allgather: out of memory");
#define SLOT(q, c) (((size_t)(q) * C + (c)) * sb)
    for (size_t c = 0; c < C; c++) {
        size_t o, n;
        loomi_chunk(count, C, c, &o, &n);
        if (n)
            arr[(size_t)r * C + c] =
                loomi_sched_encode(s, LOOMI_BUF_SCRATCH, SLOT(r, c), src, src0 + o * es, n,
                                   ef | LOOMI_ENC_DECODED, LOOMI_BUF_RECV, own_off + o * es, NULL, 0);
    }
    ring_pass(s, count, C, sb, arr, 1);
#undef SLOT
    free(arr);
    return LOOM_SUCCESS;
}

/* -------------------------------------------------- reduce_scatter */

/*
 * As ring.c's reduce-scatter, with encoded partials: step k sends the
 * encoded partial of block r-k-1 and receives that of block r-k-2, which
 * is decoded onto this rank's own contribution in an fp32 accumulator
 * (two of them, alternating) and encoded again; the last step (block r)
 * decodes onto the own contribution straight in RECV.  With error
 * feedback every own contribution is first encoded with its residual and
 * replaced by the decoded values.
 */
loom_result_t loomi_gen_reduce_scatter_cz(struct loomi_sched *s, const struct loomi_coll_args *a,
                                          const struct loomi_cz *z)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize, count = a->count;
    loom_result_t rc = setup(s, z, (size_t)p * count, 0);
    if (rc != LOOM_SUCCESS) return rc;
    if (loomi_reduce_scatter_trivial(s, count, a->inplace)) return LOOM_SUCCESS;
    const int right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
    unsigned ef = z->state ? LOOMI_ENC_EF : 0;
    size_t C = loomi_build_chunks(count * es, a->chunk_bytes), sb;
    if ((rc = slot_size(s, (count + C - 1) / C, &sb)) != LOOM_SUCCESS) return rc;
    if (6 * C > SIZE_MAX / sb || count > SIZE_MAX / 8 / es)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, r, "compressed reduce_scatter: too large");
    /* Scratch: send slots [2][C], receive slots [2][C], error-feedback
     * slots [2][C] (bytes not sent), fp32 accumulators [2][count]. */
    const size_t send0 = 0, recv0 = 2 * C * sb, ef0 = 4 * C * sb, acc0 = 6 * C * sb;
    s->buf_bytes[LOOMI_BUF_SCRATCH] = acc0 + 2 * count * es;
    uint32_t *sg = ids(2 * C), *rg = ids(2 * C), *eg = ids(2 * C), *ag = ids(2 * C),
             *enc = ids(C);
    if (!sg || !rg || !eg || !ag || !enc) {
        free(sg), free(rg), free(eg), free(ag), free(enc);
        return loomi_fail(LOOM_ERR_NO_MEMORY, r, "compressed reduce_scatter: out of memory");
    }
    for (int k = 0; k < p - 1; k++) {
        int sbk = loomi_mod(r - k - 1, p), rb = loomi_mod(r - k - 2, p);
        int lastk = k == p - 2;
        size_t b = (size_t)(k & 1), nb = (size_t)((k + 1) & 1);
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            loomi_chunk(count, C, c, &o, &n);
            if (!n) continue;
            uint32_t tag = (uint32_t)((size_t)k * C + c);
            size_t ssl = send0 + (b * C + c) * sb, rsl = recv0 + (b * C + c) * sb;
            if (k == 0)
                enc[c] = loomi_sched_encode(s, LOOMI_BUF_SCRATCH, ssl, LOOMI_BUF_SEND,
                                            ((size_t)sbk * count + o) * es, n, ef, 0, 0, NULL, 0);
            sg[b * C + c] = loomi_sched_send(s, right, tag, LOOMI_BUF_SCRATCH, ssl,
                                             slot_elems(s, n), &enc[c], 1);
            uint32_t rv = loomi_sched_recv(s, left, tag, LOOMI_BUF_SCRATCH, rsl, slot_elems(s, n),
                                           &rg[b * C + c], 1);
            /* Where the sum goes, and the own contribution it starts from. */
            int dbuf = lastk ? LOOMI_BUF_RECV : LOOMI_BUF_SCRATCH;
            size_t doff = lastk ? o * es : acc0 + (b * count + o) * es;
            int base = LOOMI_BUF_SEND;
            size_t boff = ((size_t)rb * count + o) * es;
            uint32_t e = LOOMI_NO_DEP;
            if (ef) {
                uint32_t d[2] = {eg[b * C + c], ag[b * C + c]};
                e = eg[b * C + c] = loomi_sched_encode(
                    s, LOOMI_BUF_SCRATCH, ef0 + (b * C + c) * sb, LOOMI_BUF_SEND, boff, n,
                    LOOMI_ENC_EF | LOOMI_ENC_DECODED, dbuf, doff, d, 2);
                base = dbuf;
                boff = doff;
            }
            uint32_t d[3] = {rv, e, ag[b * C + c]};
            uint32_t da = loomi_sched_decode_acc(s, dbuf, doff, base, boff, LOOMI_BUF_SCRATCH, rsl,
                                                 n, d, 3);
            rg[b * C + c] = da;
            if (!lastk) {
                uint32_t d2[2] = {da, sg[nb * C + c]};
                enc[c] = ag[b * C + c] = loomi_sched_encode(
                    s, LOOMI_BUF_SCRATCH, send0 + (nb * C + c) * sb, LOOMI_BUF_SCRATCH, doff, n, 0,
                    0, 0, d2, 2);
            } else if (s->op == LOOM_AVG) {
                loomi_sched_avg(s, LOOMI_BUF_RECV, o * es, n, &da, 1);
            }
        }
    }
    free(sg), free(rg), free(eg), free(ag), free(enc);
    return LOOM_SUCCESS;
}
