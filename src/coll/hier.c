/* hier.c - hierarchical algorithms (placeholder until written). */
#include "coll/coll.h"
#include "core/internal.h"

#define STUB(fn) \
    loom_result_t fn(struct loomi_sched *s, const struct loomi_coll_args *a) \
    { (void)a; return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, #fn ": not written yet"); }
STUB(loomi_gen_allreduce_hier)
STUB(loomi_gen_reduce_scatter_hier)
STUB(loomi_gen_allgather_hier)
STUB(loomi_gen_broadcast_hier)
STUB(loomi_gen_alltoall_hier)
