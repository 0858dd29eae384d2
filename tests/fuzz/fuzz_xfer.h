/* What the transport harnesses (fuzz_shm, fuzz_tcp, fuzz_verbs) share:
 * the callbacks they hand the transport, and receives posted from the
 * input and freed at its end. */
#ifndef LOOM_TESTS_FUZZ_XFER_H
#define LOOM_TESTS_FUZZ_XFER_H

#include <stdint.h>
#include <stdlib.h>

#include "transports/transport.h"

/* The transport's ctx.peer_failed: nothing to do. */
static inline void fuzz_on_fail(void *owner, int peer, int failed, loom_result_t code,
                                const char *why)
{
    (void)owner, (void)peer, (void)failed, (void)code, (void)why;
}

/* A receive's complete(): marks it done (owner 1), so it is not
 * cancelled after. */
static inline void fuzz_on_done(struct loomi_xfer *x, loom_result_t st)
{
    (void)st;
    x->owner = (void *)1;
}

/* A receive from peer, of the 4 bytes at d: [tag][len lo][len hi][chk]:
 * tag % 4, len % (max_len + 1), chk 0 or 0x100 + chk.  Aborts when out
 * of memory. */
static inline struct loomi_xfer *fuzz_recv(int peer, const uint8_t *d, size_t max_len)
{
    struct loomi_xfer *x = calloc(1, sizeof *x);
    if (!x) abort();
    x->peer = peer;
    x->tag = d[0] % 4;
    x->len = (size_t)(d[1] | d[2] << 8) % (max_len + 1);
    x->chk = d[3] ? 0x100u + d[3] : 0;
    x->buf = malloc(x->len ? x->len : 1);
    x->complete = fuzz_on_done;
    if (!x->buf) abort();
    return x;
}

/* Frees xs[0..n) and their buffers. */
static inline void fuzz_free_recvs(struct loomi_xfer **xs, int n)
{
    for (int k = 0; k < n; k++) {
        free(xs[k]->buf);
        free(xs[k]);
    }
}

#endif
