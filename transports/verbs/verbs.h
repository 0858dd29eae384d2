/* verbs.h - the RDMA verbs transport (verbs.c, verbs_dev.c, verbs_data.c). */
#ifndef LOOMI_VERBS_H
#define LOOMI_VERBS_H

#include <stddef.h>

#include "transports/transport.h"

/* Bytes of the address verbs publishes (fits the route's verbs slot). */
#define LOOMI_VERBS_ADDR_BYTES 32

extern const struct loomi_transport_ops loomi_verbs_ops;

/* Whether this process can use verbs at all: libibverbs loads and an RDMA
 * device with an active port is there (LOOM_IB_HCA honoured).  Returns 1,
 * or 0 with the reason in why.  Never logs above info; cheap after the
 * first call (the answer is kept). */
int loomi_verbs_available(char *why, size_t n);

/* GPUDirect RDMA through dmabuf (LOOM_GPUDIRECT), per transport state:
 * how device registrations went.  tries: new registrations attempted
 * (the driver asked for a dmabuf); regs: of those, accepted by the NIC;
 * refused: attempts the driver or the NIC refused; skipped: requests not
 * tried (LOOM_GPUDIRECT=0, or auto after a refusal); hits: requests the
 * cache served; stale: cache entries dropped because their allocation
 * was freed and made again; deregs: device registrations released. */
struct loomi_verbs_gd_stats {
    unsigned long long tries, regs, refused, skipped, hits, stale, deregs;
};
void loomi_verbs_gd_stats(void *state, struct loomi_verbs_gd_stats *st);
/* Why device memory is not registered (auto, after the first refusal),
 * or "". */
const char *loomi_verbs_gd_why(void *state);
/* Whether device memory [p, p + len) can be moved straight from or to
 * the NIC: 1 (registered, and kept in the cache), 0 (auto: refused,
 * why says why; the caller stages through host memory), or -1 where
 * LOOM_GPUDIRECT=1 makes that an error (set, naming fn). */
int loomi_verbs_gd_probe(void *state, const char *fn, void *p, size_t len, char *why, size_t n);

/* The name of the device a verbs transport state opened ("mlx5_0"). */
const char *loomi_verbs_device(void *state);

#endif
