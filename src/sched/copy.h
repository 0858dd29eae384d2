/* copy.h - the engine's copy kernels (copy.c). */
#ifndef LOOMI_COPY_H
#define LOOMI_COPY_H

#include <stddef.h>

/* d = src (n bytes), and `also` = src where not NULL: d's stores skip the
 * cache where d allows (16-aligned, n a multiple of 64), also's too with
 * also_nt; no fence (loomi_copy_fence once after them). */
void loomi_copy_stream_nf(unsigned char *d, unsigned char *also, const unsigned char *src,
                          size_t n, int also_nt);
/* The same, fenced. */
void loomi_copy_stream(unsigned char *d, unsigned char *also, const unsigned char *src, size_t n,
                       int also_nt);
/* Order the streamed stores before it (nt: there were some). */
void loomi_copy_fence(int nt);
/* save = d's old bytes, then d = src; streamed saves where nt. */
void loomi_copy_save(unsigned char *d, unsigned char *save, const unsigned char *src, size_t n,
                     int nt);
/* One block of a result in L1 to where it goes: streamed (no fence) when
 * nt and the place allows, else an ordinary copy. */
void loomi_copy_put_block(unsigned char *d, const unsigned char *src, size_t n, int nt);

#endif
