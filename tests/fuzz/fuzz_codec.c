/* Codec payloads, as a peer sends them in a compressed collective:
 * loom_codec_decode, decode_accumulate and reduce_encoded on bytes of
 * any length, for every built-in codec and a few block sizes.
 *
 * Input: byte 0 picks the codec spec, bytes 1-2 the element count
 * (little-endian, up to 8191), the rest is the encoded payload. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "tests/fuzz/fuzz.h"

static const char *const specs[] = {
    "bf16", "fp16", "int8", "int4", "fp4", "int8:1", "int8:7", "int4:4",
    "fp4:64", "topk:0.01", "topk:0.5", "topk:1",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    const char *spec = specs[data[0] % (sizeof specs / sizeof specs[0])];
    size_t count = (size_t)(data[1] | data[2] << 8) & 8191;
    const uint8_t *src = data + 3;
    size_t len = size - 3;
    const loom_codec_t *codec;
    if (loom_codec_find(spec, &codec) != LOOM_SUCCESS) abort();
    float *out = calloc(count ? count : 1, sizeof *out);
    float *acc = calloc(count ? count : 1, sizeof *acc);
    unsigned char *copy = malloc(len ? len : 1);
    if (!out || !acc || !copy) abort();
    loom_codec_decode(codec, src, len, out, count);
    loom_codec_decode_accumulate(codec, src, len, acc, count);
    memcpy(copy, src, len);
    loom_codec_reduce_encoded(codec, copy, src, len);
    /* What decoded must encode again within the codec's own bound. */
    size_t max = 0;
    if (count && loom_codec_decode(codec, src, len, out, count) == LOOM_SUCCESS &&
        loom_codec_max_encoded_bytes(codec, count, &max) == LOOM_SUCCESS) {
        unsigned char *enc = malloc(max ? max : 1);
        size_t got = 0;
        if (!enc) abort();
        for (size_t i = 0; i < count; i++)
            if (out[i] != out[i] || out[i] - out[i] != 0) out[i] = 0; /* NaN, inf */
        if (loom_codec_encode(codec, out, count, enc, max, &got, NULL) == LOOM_SUCCESS &&
            got > max)
            abort();
        free(enc);
    }
    free(copy);
    free(acc);
    free(out);
    return 0;
}

/* Seeds: each codec's encoding of a few vectors, with the right count,
 * and one with a count off by one. */
int fuzz_seeds(const char *dir)
{
    float v[300];
    for (int i = 0; i < 300; i++) v[i] = (float)((i * 37) % 101 - 50) / 7.0f;
    v[5] = 0;
    v[9] = 1e30f;
    for (unsigned k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        static const size_t counts[] = {1, 17, 300};
        for (int c = 0; c < 3; c++) {
            const loom_codec_t *codec;
            size_t max, len, count = counts[c];
            if (loom_codec_find(specs[k], &codec) ||
                loom_codec_max_encoded_bytes(codec, count, &max))
                return -1;
            unsigned char *buf = malloc(3 + max);
            if (!buf || loom_codec_encode(codec, v, count, buf + 3, max, &len, NULL)) return -1;
            size_t n = count + (c == 1); /* 17: the count one too many */
            buf[0] = (unsigned char)k;
            buf[1] = (unsigned char)n;
            buf[2] = (unsigned char)(n >> 8);
            char name[64];
            snprintf(name, sizeof name, "%s-%zu%s", specs[k], count, c == 1 ? "-off" : "");
            for (char *p = name; *p; p++)
                if (*p == ':') *p = '_';
            if (fuzz_write_seed(dir, name, buf, 3 + len)) return -1;
            free(buf);
        }
    }
    return 0;
}
