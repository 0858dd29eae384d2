/*
 * internal.h - shared by libloom-nccl's files only (not installed): the
 * communicator (struct ncclComm) with its reduction ops and siblings,
 * the thread's group state the operations read, and what one file calls
 * in the other (lnccl_*).  nccl.c says how the library works and holds
 * errors, groups and the lifecycle; ops.c holds memory, the reduction
 * ops and the operations; map.h how NCCL's enums meet Loom's.
 */
#ifndef LOOM_NCCL_INTERNAL_H
#define LOOM_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "nccl/map.h"

#define COMM_MAGIC 0x6c6e63636c636f6dULL /* "lncclcom" */
/* Dynamic ops live in [ncclNumOps, ncclNumOps + MAX_REDOPS). */
#define MAX_REDOPS 65536

struct redop {
    int used;
    int dtype;
    unsigned char scalar[8];
};

/* Communicators created by one ncclGroupEnd on one thread (all the
 * ranks of ncclCommInitAll): Loom's destroy waits (bounded) for the
 * peers' goodbye, so destroying them one after another on one thread
 * would wait for each; they are destroyed together, in parallel, when
 * the last of them is. */
struct siblings {
    int n, left;
    loom_comm_t *lcs; /* those destroyed so far, waiting for the rest */
    int nlcs;
};

struct ncclComm {
    uint64_t magic;
    struct siblings *sib;
    loom_comm_t lc;      /* NULL while the init waits for ncclGroupEnd */
    int nranks, rank, cudev;
    int pending;         /* created at the outermost ncclGroupEnd */
    atomic_int inflight; /* calls under way, or queued in an open group */
    int finalized;
    ncclResult_t init_result; /* of a deferred init */
    ncclUniqueId id;
    char transport[16];  /* from ncclConfig_t.netName; "" for Loom's choice */
    pthread_mutex_t mu;  /* ops, async */
    ncclResult_t async;  /* first error that broke it, seen here */
    struct redop *ops;
    int nops;
};

/* ---- nccl.c: logging, errors */

void lnccl_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Returns r, its reason kept for ncclGetLastError and logged. */
ncclResult_t lnccl_fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Loom's result r of fn, as NCCL's (c, if any, marked broken by it). */
ncclResult_t lnccl_from_loom(loom_result_t r, const char *fn, struct ncclComm *c);

/* ---- nccl.c: live communicators */

/* The communicator behind a handle, or NULL (and the reason recorded). */
struct ncclComm *lnccl_comm_get(ncclComm_t comm, const char *fn, ncclResult_t *r);
/* The same, and refused unless created, initialised and not finalized. */
struct ncclComm *lnccl_comm_ready(ncclComm_t comm, const char *fn, ncclResult_t *r);

/* ---- nccl.c: groups */

/* Per thread (defined in nccl.c, which says what the rest holds): the
 * depth of ncclGroupStart, scaled copies of PreMulSum inputs to free at
 * the outermost ncclGroupEnd, and the communicators of the calls queued
 * in the group (one entry per call). */
extern _Thread_local int lnccl_tl_depth;
extern _Thread_local void **lnccl_tl_tmp;
extern _Thread_local int lnccl_tl_ntmp, lnccl_tl_captmp;
extern _Thread_local struct ncclComm **lnccl_tl_queued;
extern _Thread_local int lnccl_tl_nqueued, lnccl_tl_capqueued;

/* Append p to a growing array; -1 when out of memory. */
int lnccl_push_ptr(void ***arr, int *n, int *cap, void *p);
/* r, the first error inside a group also kept for its ncclGroupEnd. */
ncclResult_t lnccl_group_note(ncclResult_t r);
/* Before a call: inside an NCCL group, opens Loom's group once. */
ncclResult_t lnccl_enter_op(const char *fn);

/* NCCL exports every call a second time as pnccl* (for profilers); each
 * file aliases the calls it defines. */
#define PNCCL(f) extern __typeof__(f) p##f __attribute__((alias(#f)))

#endif
