/* topo.c - hwloc discovery (placeholder). */
#include "topo/topo.h"
#include <stdlib.h>
void loomi_topo_job_free(struct loomi_topo_job *job)
{
    if (!job) return;
    free(job->ranks);
    free(job->map);
    job->ranks = NULL;
    job->map = NULL;
}
