/* group.h - loom_group_start/end: calls queued per thread, run together. */
#ifndef LOOMI_GROUP_H
#define LOOMI_GROUP_H

#include "sched/sched.h"

/* Nonzero between loom_group_start and the outermost loom_group_end of
 * the calling thread. */
int loomi_group_active(void);
/* Queue a built schedule (ownership passes to the group) to be started
 * at the outermost loom_group_end. */
loom_result_t loomi_group_queue(struct loom_comm *comm, struct loomi_sched *s,
                                const void *sendbuf, void *recvbuf, int inplace);

#endif
