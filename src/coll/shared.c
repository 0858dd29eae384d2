/* shared.c - intra-host collectives through shared arenas (placeholder). */
#include "coll/coll.h"
#include "core/internal.h"

loom_result_t loomi_gen_allreduce_shared(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "shared allreduce: not written yet");
}
