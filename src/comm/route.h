/* route.h - per-peer choice of transport behind one ops table (route.c). */
#ifndef LOOMI_ROUTE_H
#define LOOMI_ROUTE_H

#include <stdio.h>

#include "topo/hostmap.h"
#include "transports/transport.h"

/* A route address: each sub-transport's address in a 64-byte slot. */
#define LOOMI_ROUTE_ADDR_BYTES 128

extern const struct loomi_transport_ops loomi_route_ops;

/* "tcp, shm, verbs": the transports this build has. */
const char *loomi_route_names(void);
/* LOOM_TRANSPORT ("tcp", "shm", "tcp,shm"; empty: all) into a mask;
 * an unknown name is an error listing the known ones. */
loom_result_t loomi_route_parse(const char *spec, unsigned *mask, int rank);
/* Create every allowed sub-transport (init time). */
/* `events` counts completed transfers (the engine's): progress() returns
 * as soon as it moves. */
loom_result_t loomi_route_create(const struct loomi_tctx *ctx, unsigned mask,
                                 const uint64_t *events, void **state);
/* Which ranks share a host; must be called before connect_all. */
void loomi_route_set_hosts(void *state, const struct loomi_hostmap *hosts);
/* "shm+tcp (3 peer(s) over shm, 4 over tcp)" */
const char *loomi_route_describe(void *state, char *buf, size_t n);
/* Index of the transport carrying data to peer (0 tcp, 1 shm, 2 verbs), -1 for self. */
int loomi_route_peer_transport(void *state, int peer, const char **name);
int loomi_route_has_shm(void *state);

#endif
