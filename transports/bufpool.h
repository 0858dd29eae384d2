/* bufpool.h - buffers for early messages, kept for reuse.
 *
 * A transport copies a message whose receive is not posted yet into a
 * buffer of its own.  A peer that starts the next collective first sends
 * into such buffers every time, and a fresh large allocation is a fresh
 * mapping that page-faults on every message (16K faults for 64 MiB in 4K
 * pages, which on a VM with dear faults cost far more than the copy; see
 * perf/NOTES.md, "bufpool.h, page faults").  So the transports keep the
 * buffers they are done with, up to a total, and hand them out again.
 * One pool per transport instance; not thread-safe (the transport's
 * lock). */
#ifndef LOOM_BUFPOOL_H
#define LOOM_BUFPOOL_H

#include <stddef.h>

#define LOOMI_BUFPOOL_SLOTS 16
#define LOOMI_BUFPOOL_MAX_BYTES ((size_t)256 << 20)

struct loomi_bufpool {
    struct {
        char *p;
        size_t cap;
    } b[LOOMI_BUFPOOL_SLOTS];
    int n;
    size_t bytes;
};

/* A buffer of at least len bytes (the smallest kept one that fits, or a
 * new one), its size in *cap; NULL when out of memory. */
char *loomi_bufpool_get(struct loomi_bufpool *pl, size_t len, size_t *cap);
/* Done with p (cap bytes, from loomi_bufpool_get): kept or freed. */
void loomi_bufpool_put(struct loomi_bufpool *pl, char *p, size_t cap);
void loomi_bufpool_clear(struct loomi_bufpool *pl);

/* Small objects of one kind kept for reuse (tcp's pieces, verbs' ops,
 * sim's nodes): a kept object's first bytes link it to the next, so an
 * object must be at least a pointer's size.  Not thread-safe either. */
struct loomi_objpool {
    void *free;
};

/* A zeroed object of `size` bytes (a kept one, or new); NULL when out of
 * memory.  One pool hands out one size. */
void *loomi_objpool_get(struct loomi_objpool *op, size_t size);
/* Done with o: kept. */
void loomi_objpool_put(struct loomi_objpool *op, void *o);
/* Frees what is kept. */
void loomi_objpool_clear(struct loomi_objpool *op);

#endif
