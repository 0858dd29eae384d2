/* rooted.c - rooted collectives */
#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

loom_result_t loomi_gen_broadcast_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_broadcast_tree: not written yet");
}

loom_result_t loomi_gen_broadcast_sag(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_broadcast_sag: not written yet");
}

loom_result_t loomi_gen_reduce_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_reduce_tree: not written yet");
}

loom_result_t loomi_gen_reduce_sag(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_reduce_sag: not written yet");
}

loom_result_t loomi_gen_gather_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_gather_tree: not written yet");
}

loom_result_t loomi_gen_gather_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_gather_pairwise: not written yet");
}

loom_result_t loomi_gen_scatter_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_scatter_tree: not written yet");
}

loom_result_t loomi_gen_scatter_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_gen_scatter_pairwise: not written yet");
}
