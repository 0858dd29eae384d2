/*
 * copy.c - the engine's copy kernels: copies whose stores skip the cache
 * (streamed) for data nobody reads soon, a copy that saves the bytes it
 * overwrites, and the fence that orders streamed stores.
 */
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "reduce/reduce.h"
#include "sched/copy.h"

#if defined(__x86_64__)
/* stream_nofence's loop with 64-byte stores, one per line, for a 64-aligned
 * d where the CPU has AVX-512: faster than 16-byte stores for large copies
 * and the shared allreduces built on them, in and out of place and in
 * windows (perf/NOTES.md, "copy.c, 64-byte stores"). */
__attribute__((target("avx512f"))) static void stream64(unsigned char *d, unsigned char *also,
                                                        const unsigned char *src, size_t n,
                                                        int also_nt)
{
    for (size_t i = 0; i < n; i += 64) {
        __m512i a = _mm512_loadu_si512((const void *)(src + i));
        _mm512_stream_si512((void *)(d + i), a);
        if (also_nt) _mm512_stream_si512((void *)(also + i), a);
        else if (also) _mm512_storeu_si512((void *)(also + i), a);
    }
}

/* loomi_copy_save's loop with 64-byte stores: save (64-aligned) = d, d = src. */
__attribute__((target("avx512f"))) static void save64(unsigned char *d, unsigned char *save,
                                                      const unsigned char *src, size_t n)
{
    for (size_t i = 0; i < n; i += 64) {
        _mm512_stream_si512((void *)(save + i), _mm512_loadu_si512((const void *)(d + i)));
        _mm512_storeu_si512((void *)(d + i), _mm512_loadu_si512((const void *)(src + i)));
    }
}
#endif

/* Stores of n bytes (a multiple of 64) to d that skip the cache, and to
 * `also` when not NULL, through the cache or, with also_nt, skipping it
 * too; without the fence: callers fence once after all their streamed
 * stores.  d must be 16-aligned, and also with also_nt. */
static void stream_nofence(unsigned char *d, unsigned char *also, const unsigned char *src,
                           size_t n, int also_nt)
{
#if defined(__x86_64__)
    if (!((uintptr_t)d & 63) && (!also_nt || !((uintptr_t)also & 63)) &&
        loomi_reduce_cpu_avx512()) {
        stream64(d, also, src, n, also_nt);
        return;
    }
    for (size_t i = 0; i < n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 48));
        _mm_stream_si128((__m128i *)(void *)(d + i), a);
        _mm_stream_si128((__m128i *)(void *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + i + 48), e);
        if (also_nt) {
            _mm_stream_si128((__m128i *)(void *)(also + i), a);
            _mm_stream_si128((__m128i *)(void *)(also + i + 16), b);
            _mm_stream_si128((__m128i *)(void *)(also + i + 32), c);
            _mm_stream_si128((__m128i *)(void *)(also + i + 48), e);
        } else if (also) {
            _mm_storeu_si128((__m128i *)(void *)(also + i), a);
            _mm_storeu_si128((__m128i *)(void *)(also + i + 16), b);
            _mm_storeu_si128((__m128i *)(void *)(also + i + 32), c);
            _mm_storeu_si128((__m128i *)(void *)(also + i + 48), e);
        }
    }
#else
    (void)also_nt;
    memcpy(d, src, n);
    if (also) memcpy(also, src, n);
#endif
}

/* memcpy for a copy that is read back only if the operation fails (the
 * saved input of saves_input), or that the operation does not read again
 * and is too big for the cache (LOOMI_COPY_STREAM): non-temporal stores
 * leave the cache to the data the operation is working on, and skip
 * reading the lines they overwrite.  `also`, when not NULL, gets the
 * same bytes in the same pass (LOOMI_COPY_ALSO: an in-place input copied
 * into an arena and saved at once, read from memory once, not twice),
 * through the cache, or with also_nt streamed too (where `also` lies as
 * d does within 64-byte lines; elsewhere it goes through the cache).
 * copy_stream_nf leaves out the fence, for
 * loops over blocks that fence once at the end (stream_fence): a fence per
 * block waits for each block's stores to reach memory before the next
 * block's loads. */
void loomi_copy_stream_nf(unsigned char *d, unsigned char *also, const unsigned char *src,
                           size_t n, int also_nt)
{
#if defined(__x86_64__)
    if (!also || (((uintptr_t)also ^ (uintptr_t)d) & 63)) also_nt = 0;
    size_t head = (size_t)(-(uintptr_t)d & 63); /* lines whole: see stream64 */
    if (n < 4096 || head >= n) head = n;
    memcpy(d, src, head);
    if (also) memcpy(also, src, head);
    if (head == n) return;
    d += head;
    if (also) also += head;
    src += head;
    n -= head;
    const size_t body = n - n % 64;
    stream_nofence(d, also, src, body, also_nt);
    memcpy(d + body, src + body, n % 64);
    if (also) memcpy(also + body, src + body, n % 64);
#else
    (void)also_nt;
    memcpy(d, src, n);
    if (also) memcpy(also, src, n);
#endif
}

void loomi_copy_fence(int nt)
{
#if defined(__x86_64__)
    if (nt) _mm_sfence();
#else
    (void)nt;
#endif
}

void loomi_copy_stream(unsigned char *d, unsigned char *also, const unsigned char *src,
                        size_t n, int also_nt)
{
    loomi_copy_stream_nf(d, also, src, n, also_nt);
    loomi_copy_fence(1);
}

/* dst = src, saving dst's old bytes to `save` first (LOOMI_COPY_SAVE),
 * with non-temporal stores where `nt`: each old line is read once, for
 * the save, and is then in cache for the store that overwrites it.
 * Without `nt` (a vector the caches keep) the save stays in cache, where
 * the next call's save finds its lines. */
void loomi_copy_save(unsigned char *d, unsigned char *save, const unsigned char *src, size_t n,
                      int nt)
{
    if (!nt) {
        memcpy(save, d, n);
        memcpy(d, src, n);
        return;
    }
#if defined(__x86_64__)
    size_t head = (size_t)(-(uintptr_t)save & 63);
    if (n < 4096 || head >= n) head = n;
    memcpy(save, d, head);
    memcpy(d, src, head);
    if (head == n) return;
    d += head;
    save += head;
    src += head;
    n -= head;
    size_t k = n / 64;
    if (loomi_reduce_cpu_avx512()) {
        save64(d, save, src, k * 64);
        d += k * 64, save += k * 64, src += k * 64;
        k = 0;
    }
    for (size_t i = 0; i < k; i++, d += 64, save += 64, src += 64) {
        for (int j = 0; j < 64; j += 16) {
            __m128i old = _mm_loadu_si128((const __m128i *)(const void *)(d + j));
            _mm_stream_si128((__m128i *)(void *)(save + j), old);
        }
        for (int j = 0; j < 64; j += 16)
            _mm_storeu_si128((__m128i *)(void *)(d + j),
                             _mm_loadu_si128((const __m128i *)(const void *)(src + j)));
    }
    _mm_sfence();
    memcpy(save, d, n % 64);
    memcpy(d, src, n % 64);
#else
    memcpy(save, d, n);
    memcpy(d, src, n);
#endif
}

/* One block of a result in L1 to where it goes: streamed (no fence) when
 * nt and the place allows, else an ordinary copy. */
void loomi_copy_put_block(unsigned char *d, const unsigned char *src, size_t n, int nt)
{
    if (nt && !((uintptr_t)d & 15) && n % 64 == 0) stream_nofence(d, NULL, src, n, 0);
    else memcpy(d, src, n);
}

