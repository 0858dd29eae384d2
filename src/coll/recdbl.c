/* recdbl.c - recursive doubling */
#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

loom_result_t loomi_gen_allreduce_rd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_allreduce_rd: not written yet");
}

loom_result_t loomi_gen_allgather_rd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_allgather_rd: not written yet");
}
