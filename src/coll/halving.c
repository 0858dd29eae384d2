/* halving.c - halving-doubling */
#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

loom_result_t loomi_gen_allreduce_hd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_allreduce_hd: not written yet");
}

loom_result_t loomi_gen_reduce_scatter_hd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_reduce_scatter_hd: not written yet");
}
