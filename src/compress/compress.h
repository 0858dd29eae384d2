/*
 * compress.h - the codec layer behind loom_codec_* (include/loom.h,
 * "compression"): the registry, the built-in codecs and the helpers the
 * collectives engine uses per hop.  Internal names are loomi_codec_*.
 *
 * How an engine uses a codec (see loom-codecs(7) for the wire formats):
 *
 *   additive (LOOM_CODEC_ADDITIVE, bf16/fp16): encode each rank's chunk
 *     once; every hop reduces the received bytes into its own encoded
 *     chunk with loom_codec_reduce_encoded and forwards the result.
 *   decode-reduce (LOOM_CODEC_DECODE_REDUCE, int8/int4/fp4): every hop
 *     decode-accumulates the received bytes into an fp32 accumulator
 *     (loom_codec_decode_accumulate) and, if it forwards, encodes the
 *     accumulator again.  The owner of a chunk's final value encodes it
 *     once with loom_codec_encode(..., decoded) and keeps `decoded`; the
 *     other ranks decode those bytes, which are forwarded verbatim, so all
 *     ranks end with the same values.
 *   gather-only (LOOM_CODEC_GATHER_ONLY, topk): each rank encodes its own
 *     contribution (with error feedback, loom_codec_encode_ef); the encoded
 *     chunks are all-gathered and every rank decode-accumulates all of them
 *     in rank order (so the fp32 sums agree bit for bit).
 *
 * Error feedback state (loom_codec_state_t) is committed by the engine
 * when the collective succeeds and rolled back when it fails.
 */
#ifndef LOOMI_COMPRESS_H
#define LOOMI_COMPRESS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom.h"

/* ------------------------------------------------------------ wire format */

/* Every built-in encoding starts with this 16-byte header:
 *   0  'L' 'C'      magic
 *   2  u8           codec id (LOOMI_CODEC_ID_*)
 *   3  u8           format version (LOOMI_CODEC_WIRE_VERSION)
 *   4  u32 LE       parameter: block size for int8/int4/fp4, 0 otherwise
 *   8  u64 LE       element count
 * topk adds a u64 LE k (the number of pairs) at offset 16. */
#define LOOMI_CODEC_HDR_BYTES 16u
#define LOOMI_CODEC_MAGIC0 0x4cu /* 'L' */
#define LOOMI_CODEC_MAGIC1 0x43u /* 'C' */
#define LOOMI_CODEC_WIRE_VERSION 1u

enum loomi_codec_id {
    LOOMI_CODEC_ID_BF16 = 1,
    LOOMI_CODEC_ID_FP16 = 2,
    LOOMI_CODEC_ID_INT8 = 3,
    LOOMI_CODEC_ID_INT4 = 4,
    LOOMI_CODEC_ID_FP4 = 5,
    LOOMI_CODEC_ID_TOPK = 6
};

/* Block sizes the block codecs accept ("int8:B"), and their default. */
#define LOOMI_CODEC_BLOCK_DEFAULT 256u
#define LOOMI_CODEC_BLOCK_MAX (1u << 20)
/* Default fraction of elements top-k sends ("topk" = "topk:0.01"). */
#define LOOMI_CODEC_TOPK_DEFAULT 0.01

/* Little-endian loads and stores that need no alignment. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LOOMI_CODEC_BIG_ENDIAN 1
#else
#define LOOMI_CODEC_BIG_ENDIAN 0
#endif

static inline uint32_t loomi_le32_load(const void *p)
{
    const unsigned char *b = (const unsigned char *)p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
           (uint32_t)b[3] << 24;
}

static inline void loomi_le32_store(void *p, uint32_t v)
{
    unsigned char *b = (unsigned char *)p;
    b[0] = (unsigned char)v;
    b[1] = (unsigned char)(v >> 8);
    b[2] = (unsigned char)(v >> 16);
    b[3] = (unsigned char)(v >> 24);
}

static inline uint64_t loomi_le64_load(const void *p)
{
    const unsigned char *b = (const unsigned char *)p;
    return (uint64_t)loomi_le32_load(b) | (uint64_t)loomi_le32_load(b + 4) << 32;
}

static inline void loomi_le64_store(void *p, uint64_t v)
{
    unsigned char *b = (unsigned char *)p;
    loomi_le32_store(b, (uint32_t)v);
    loomi_le32_store(b + 4, (uint32_t)(v >> 32));
}

/* ------------------------------------------------------------- built-ins */

/* The built-in codec tables (codecs.c), registered at first use of the
 * registry.  Their params are set by their configure hook. */
extern const loom_codec_t loomi_codec_bf16;
extern const loom_codec_t loomi_codec_fp16;
extern const loom_codec_t loomi_codec_int8;
extern const loom_codec_t loomi_codec_int4;
extern const loom_codec_t loomi_codec_fp4;
extern const loom_codec_t loomi_codec_topk;

/* ------------------------------------------------------------- registry */

/* The kind bits of props (exactly one is set in a registered codec). */
#define LOOMI_CODEC_KINDS                                                      \
    (LOOM_CODEC_ADDITIVE | LOOM_CODEC_DECODE_REDUCE | LOOM_CODEC_GATHER_ONLY)

/* The kind of a codec found with loom_codec_find (one LOOM_CODEC_* bit). */
static inline unsigned int loomi_codec_kind(const loom_codec_t *c)
{
    return c->props & LOOMI_CODEC_KINDS;
}

/* Number of user codecs that may be registered, and of distinct specs
 * ("int8:128", ...) that may be instantiated, per process. */
#define LOOMI_CODEC_MAX_REGISTERED 64
#define LOOMI_CODEC_MAX_INSTANCES 4096

#endif
