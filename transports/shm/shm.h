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

/* Prefix of every segment in /dev/shm: "loom-<job key hex>-<rank>-<pid>-<n>". */
#define LOOMI_SHM_PREFIX "loom-"

#endif
