/* route.h - per-peer choice of transport behind one ops table (route.c). */
#ifndef LOOMI_ROUTE_H
#define LOOMI_ROUTE_H

#include <stdio.h>

#include "transports/transport.h"

/* A route address: each sub-transport's address in a 64-byte slot. */
#define LOOMI_ROUTE_ADDR_BYTES 128

extern const struct loomi_transport_ops loomi_route_ops;

/* "tcp, shm, verbs": the transports this build has. */
const char *loomi_route_names(void);
/* The RDMA device the route's verbs transport opened, or NULL. */
const char *loomi_route_rdma_device(void *state);
/* The verbs transport's state, or NULL where verbs was not opened (its
 * GPUDirect counters: verbs.h). */
void *loomi_route_verbs_state(void *state);
/* LOOM_TRANSPORT ("tcp", "shm", "tcp,shm"; empty: all) into a mask;
 * an unknown name is an error listing the known ones. */
loom_result_t loomi_route_parse(const char *spec, unsigned *mask, int rank);
/* Create every allowed sub-transport (init time). */
/* `events` counts completed transfers (the engine's): progress() returns
 * as soon as it moves. */
loom_result_t loomi_route_create(const struct loomi_tctx *ctx, unsigned mask,
                                 const uint64_t *events, void **state);
/* Which ranks share a host: host_of[r], the same number for ranks of one
 * host (kept, not copied: it must outlive the route); before
 * connect_all. */
void loomi_route_set_hosts(void *state, const int *host_of);
/* "shm+tcp (3 peer(s) over shm, 4 over tcp)" */
const char *loomi_route_describe(void *state, char *buf, size_t n);
/* Index of the transport carrying data to peer (0 tcp, 1 shm, 2 verbs), -1 for self. */
int loomi_route_peer_transport(void *state, int peer, const char **name);
int loomi_route_has_shm(void *state);
/* Ranks of this machine outnumber its cores (loomi_shm_crowded). */
void loomi_route_shm_crowded(void *state);
/* The largest message to peer that goes through shared memory's cells
 * (0: not over shared memory). */
size_t loomi_route_shm_cells_max(void *state, int peer);
/* Whether data to peer goes over verbs while TCP reaches it too, so
 * that either can carry it. */
int loomi_route_can_switch(void *state, int peer);
/* Carry data to peer over verbs (1) or TCP (0); both ends must switch at
 * the same point of their message sequence, with nothing in flight
 * between them.  Only for peers loomi_route_can_switch accepted. */
void loomi_route_switch(void *state, int peer, int verbs);
/* The same for every such peer: the job-wide choice after the probe. */
void loomi_route_switch_all(void *state, int verbs);
/* Register memory with the sub-transports that need it (verbs); *done
 * is 1 when one did, and then loomi_route_mem_deregister undoes it. */
loom_result_t loomi_route_mem_register(void *state, void *addr, size_t len, struct loomi_mr *mr,
                                       int *done);
void loomi_route_mem_deregister(void *state, struct loomi_mr *mr);

#endif
