/*
 * cuipc.h - CUDA device memory shared between the processes of one host
 * (cuipc.c): a rank exports a device buffer as an IPC handle of its
 * allocation plus the buffer's offset and length in it; a peer opens the
 * handle (cuIpcOpenMemHandle) and reads or writes the buffer through its
 * own mapping.  Mappings are cached per communicator, keyed by (peer,
 * handle, buffer id: the driver's number for one allocation, never
 * reused in a process, so that memory freed and allocated again is
 * opened again), so that calls repeated on the same buffers open
 * nothing; the cache is closed with the communicator.
 */
#ifndef LOOMI_CUIPC_H
#define LOOMI_CUIPC_H

#include <stddef.h>
#include <stdint.h>

#include "core/cuda.h"
#include "loom.h"

/* What a rank sends its peers about one buffer: fixed size, host
 * endian (the peers are on the same host). */
struct loomi_cuipc_desc {
    loomi_cu_ipc_t handle; /* of the allocation holding the buffer */
    uint64_t buffer_id;    /* the allocation's CU_POINTER_ATTRIBUTE_BUFFER_ID (0: unknown) */
    uint64_t offset;       /* of the buffer from the allocation's base */
    uint64_t len;          /* its bytes */
};

struct loomi_cuipc; /* a communicator's open mappings */

/* Describe device buffer [p, p + len) for the peers: LOOM_ERR_SYSTEM,
 * naming `what`, where the driver cannot (not device memory, memory not
 * made by cuMemAlloc, ...). */
loom_result_t loomi_cuipc_export(const void *p, size_t len, const char *what, int rank,
                                 struct loomi_cuipc_desc *out);
/* The buffer d that peer sent, in this process: opened or found in
 * *cache (created on first use).  d's offset and length are checked
 * against the allocation that the handle opens (LOOM_ERR_PROTOCOL,
 * naming the peer, where they do not fit). */
loom_result_t loomi_cuipc_open(struct loomi_cuipc **cache, int rank, int peer,
                               const struct loomi_cuipc_desc *d, loomi_cuptr_t *out);
/* Mappings open now, and opened in all (for tests and logs). */
size_t loomi_cuipc_count(const struct loomi_cuipc *cache, size_t *opened);
/* Close every mapping and free the cache (*cache NULL after). */
void loomi_cuipc_close_all(struct loomi_cuipc **cache);

#endif
