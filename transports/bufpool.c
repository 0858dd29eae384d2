/* bufpool.c - buffers for early messages, kept for reuse (bufpool.h). */
#include <stdlib.h>
#include <string.h>

#include "transports/bufpool.h"

char *loomi_bufpool_get(struct loomi_bufpool *pl, size_t len, size_t *cap)
{
    int best = -1;
    for (int i = 0; i < pl->n; i++)
        if (pl->b[i].cap >= len && (best < 0 || pl->b[i].cap < pl->b[best].cap)) best = i;
    if (best >= 0) {
        char *p = pl->b[best].p;
        *cap = pl->b[best].cap;
        pl->bytes -= *cap;
        pl->b[best] = pl->b[--pl->n];
        return p;
    }
    *cap = len ? len : 1;
    return malloc(*cap);
}

void loomi_bufpool_put(struct loomi_bufpool *pl, char *p, size_t cap)
{
    if (!p) return;
    if (pl->n == LOOMI_BUFPOOL_SLOTS || pl->bytes + cap > LOOMI_BUFPOOL_MAX_BYTES) {
        /* Full: drop the smallest kept buffer if this one is larger. */
        int small = -1;
        for (int i = 0; i < pl->n; i++)
            if (small < 0 || pl->b[i].cap < pl->b[small].cap) small = i;
        if (small < 0 || pl->b[small].cap >= cap ||
            pl->bytes - pl->b[small].cap + cap > LOOMI_BUFPOOL_MAX_BYTES) {
            free(p);
            return;
        }
        free(pl->b[small].p);
        pl->bytes -= pl->b[small].cap;
        pl->b[small] = pl->b[--pl->n];
    }
    pl->b[pl->n].p = p;
    pl->b[pl->n++].cap = cap;
    pl->bytes += cap;
}

void loomi_bufpool_clear(struct loomi_bufpool *pl)
{
    for (int i = 0; i < pl->n; i++) free(pl->b[i].p);
    pl->n = 0;
    pl->bytes = 0;
}

void *loomi_objpool_get(struct loomi_objpool *op, size_t size)
{
    void *o = op->free;
    if (o) memcpy(&op->free, o, sizeof op->free);
    else o = malloc(size);
    if (o) memset(o, 0, size);
    return o;
}

void loomi_objpool_put(struct loomi_objpool *op, void *o)
{
    memcpy(o, &op->free, sizeof op->free);
    op->free = o;
}

void loomi_objpool_clear(struct loomi_objpool *op)
{
    while (op->free) {
        void *o = op->free;
        memcpy(&op->free, o, sizeof op->free);
        free(o);
    }
}
