/* embed.c - sub-collectives inside a schedule (placeholder). */
#include "coll/coll.h"
#include "core/internal.h"

loom_result_t loomi_embed(struct loomi_sched *s, const struct loomi_embed *e,
                          const struct loomi_coll_args *a, int algo, uint32_t *join)
{
    (void)e; (void)a; (void)algo; *join = LOOMI_NO_DEP;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "loomi_embed: not written yet");
}
