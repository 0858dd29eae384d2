/* alltoall.c - all-to-all */
#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

loom_result_t loomi_gen_alltoall_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_alltoall_pairwise: not written yet");
}

loom_result_t loomi_gen_alltoall_bruck(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_alltoall_bruck: not written yet");
}

loom_result_t loomi_gen_alltoallv_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_alltoallv_pairwise: not written yet");
}
