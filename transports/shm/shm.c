/* shm.c - shared-memory transport (placeholder). */
#include "transports/transport.h"
const struct loomi_transport_ops loomi_shm_ops = {.name = "shm"};
