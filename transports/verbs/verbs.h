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

/* The name of the device a verbs transport state opened ("mlx5_0"). */
const char *loomi_verbs_device(void *state);

#endif
