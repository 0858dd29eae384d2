/*
 * shm.h - what the shared-memory transport shows besides its ops table
 * (loomi_shm_ops, declared in transport.h): knobs for tests.
 */
#ifndef LOOMI_SHM_H
#define LOOMI_SHM_H

/* Test hook: when non-zero, every single-copy read of message data
 * behaves as if the kernel refused it with EPERM, so the "no CMA"
 * fallback can be exercised on machines where CMA works.  Set it before
 * the first transfer; never set by the library itself. */
extern int loomi_shm_fault_cma;

/* Ranks of this machine outnumber its cores: a single-copy send waits
 * for its reader, who may be waiting for the core, while the cells take
 * a message at once.  From now on, messages that fit a peer's FIFO go
 * through the cells whatever LOOM_SHM_CMA says; larger ones as before. */
void loomi_shm_crowded(void *state);
/* The largest message that goes through the cells to peer (the rest
 * single-copy), as loomi_shm_crowded left it; 0 for a peer not on this
 * host. */
size_t loomi_shm_cells_max(void *state, int peer);

/* Prefix of every segment in /dev/shm: "loom-<job key hex>-<rank>-<pid>-<n>". */
#define LOOMI_SHM_PREFIX "loom-"

#endif
