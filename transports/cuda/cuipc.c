/*
 * cuipc.c - CUDA IPC mappings of peers' device buffers (cuipc.h).
 *
 * A cache entry is one opened allocation of one peer: the handle's 64
 * bytes, the base the driver mapped it at and its size (asked of the
 * driver after opening, so that a peer's offset and length are checked
 * against what is really mapped, not against what the peer says).  The
 * cache holds at most CAP entries; past that the least recently used is
 * closed (only between calls: no mapping is in use then).
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "transports/cuda/cuipc.h"

#define CAP 64

struct entry {
    int peer;
    loomi_cu_ipc_t handle;
    uint64_t buffer_id;
    loomi_cuptr_t base;
    size_t size;
    uint64_t used; /* the cache's clock at the last use */
};

struct loomi_cuipc {
    struct entry e[CAP];
    int n;
    uint64_t clock;
    size_t opened;
};

loom_result_t loomi_cuipc_export(const void *p, size_t len, const char *what, int rank,
                                 struct loomi_cuipc_desc *out)
{
    const struct loomi_cuda_drv *cu = loomi_cuda_driver();
    memset(out, 0, sizeof *out);
    if (!cu || !loomi_cuda_ipc())
        return loomi_fail(LOOM_ERR_UNSUPPORTED, rank, "CUDA IPC: the driver has no IPC functions");
    loomi_cuptr_t a = (loomi_cuptr_t)(uintptr_t)p, base = 0;
    size_t size = 0;
    loomi_cu_t e = cu->MemGetAddressRange(&base, &size, a);
    if (e)
        return loomi_fail(LOOM_ERR_SYSTEM, rank, "CUDA IPC: cuMemGetAddressRange of %s %p: %s",
                          what, p, loomi_cuda_strerror(e));
    if (a < base || a - base > size || len > size - (a - base))
        return loomi_fail(LOOM_ERR_SYSTEM, rank,
                          "CUDA IPC: %s %p (%zu bytes) is not within its allocation", what, p,
                          len);
    if ((e = cu->IpcGetMemHandle(&out->handle, base)))
        return loomi_fail(LOOM_ERR_SYSTEM, rank, "CUDA IPC: cuIpcGetMemHandle of %s %p: %s",
                          what, p, loomi_cuda_strerror(e));
    /* Where the driver has no buffer id the handle alone is the key. */
    unsigned long long id = 0;
    if (cu->PointerGetAttribute(&id, LOOMI_CU_POINTER_ATTRIBUTE_BUFFER_ID, base)) id = 0;
    out->buffer_id = id;
    out->offset = a - base;
    out->len = len;
    return LOOM_SUCCESS;
}

static void close_entry(struct entry *x)
{
    const struct loomi_cuda_drv *cu = loomi_cuda_driver();
    if (cu && cu->IpcCloseMemHandle && x->base) cu->IpcCloseMemHandle(x->base);
    x->base = 0;
}

loom_result_t loomi_cuipc_open(struct loomi_cuipc **cache, int rank, int peer,
                               const struct loomi_cuipc_desc *d, loomi_cuptr_t *out)
{
    const struct loomi_cuda_drv *cu = loomi_cuda_driver();
    *out = 0;
    if (!cu || !loomi_cuda_ipc())
        return loomi_fail(LOOM_ERR_UNSUPPORTED, rank, "CUDA IPC: the driver has no IPC functions");
    if (!*cache && !(*cache = calloc(1, sizeof **cache)))
        return loomi_fail(LOOM_ERR_NO_MEMORY, rank, "CUDA IPC: out of memory");
    struct loomi_cuipc *c = *cache;
    struct entry *x = NULL;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].peer == peer && c->e[i].buffer_id == d->buffer_id &&
            !memcmp(&c->e[i].handle, &d->handle, sizeof d->handle)) {
            x = &c->e[i];
            break;
        }
    if (!x) {
        if (c->n == CAP) { /* the least recently used goes */
            int lru = 0;
            for (int i = 1; i < c->n; i++)
                if (c->e[i].used < c->e[lru].used) lru = i;
            close_entry(&c->e[lru]);
            c->e[lru] = c->e[--c->n];
        }
        struct entry nx = {.peer = peer, .handle = d->handle, .buffer_id = d->buffer_id};
        loomi_cu_t e = cu->IpcOpenMemHandle(&nx.base, d->handle,
                                            LOOMI_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (e)
            return loomi_fail(LOOM_ERR_SYSTEM, rank,
                              "CUDA IPC: cuIpcOpenMemHandle of rank %d's buffer: %s", peer,
                              loomi_cuda_strerror(e));
        loomi_cuptr_t b = 0;
        if ((e = cu->MemGetAddressRange(&b, &nx.size, nx.base)) || b != nx.base) {
            close_entry(&nx);
            return loomi_fail(LOOM_ERR_SYSTEM, rank,
                              "CUDA IPC: cuMemGetAddressRange of rank %d's mapped buffer: %s",
                              peer, e ? loomi_cuda_strerror(e) : "not its base");
        }
        c->opened++;
        c->e[c->n] = nx;
        x = &c->e[c->n++];
    }
    x->used = ++c->clock;
    /* The peer's offset and length, against the size really mapped. */
    if (d->offset > x->size || d->len > x->size - d->offset)
        return loomi_fail(LOOM_ERR_REMOTE, rank,
                          "CUDA IPC: rank %d sent a buffer of %llu bytes at offset %llu of an "
                          "allocation of %zu bytes",
                          peer, (unsigned long long)d->len, (unsigned long long)d->offset,
                          x->size);
    *out = x->base + d->offset;
    return LOOM_SUCCESS;
}

size_t loomi_cuipc_count(const struct loomi_cuipc *c, size_t *opened)
{
    if (opened) *opened = c ? c->opened : 0;
    return c ? (size_t)c->n : 0;
}

void loomi_cuipc_close_all(struct loomi_cuipc **cache)
{
    struct loomi_cuipc *c = *cache;
    if (!c) return;
    for (int i = 0; i < c->n; i++) close_entry(&c->e[i]);
    free(c);
    *cache = NULL;
}
