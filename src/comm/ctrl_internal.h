/*
 * ctrl_internal.h - shared by the control plane's files only: its wire
 * constants, the state (struct loomi_ctrl, struct peer), the byte
 * encoding, and what the owner's side (ctrl_owner.c) calls of the
 * service thread's file (ctrl.c).
 */
#ifndef LOOMI_CTRL_INTERNAL_H
#define LOOMI_CTRL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/ctrl.h"
#include "core/internal.h"
#include "transports/auth.h"
#include "transports/seal.h"

#define CTRL_ADDR_MAGIC 0x4c4d4341u  /* "LMCA" */
#define CTRL_HELLO_MAGIC 0x4c4d4348u /* "LMCH" */
#define CTRL_MSG_MAGIC 0x4c4d434du   /* "LMCM" */
/* 2: after the handshake of auth.h, without the key */
#define CTRL_VERSION 2u
#define HDR_BYTES 32
#define HELLO_BYTES 48
/* A peer whose unsent bytes pile up beyond this is not reading: it is
 * failed rather than buffered for without bound. */
#define OUT_LIMIT ((size_t)LOOMI_CTRL_MAX_PAYLOAD + (1u << 20))

/* In a revocation's argument: the job was refused because two jobs
 * share its rendezvous address (loomi_boot_late_hello). */
#define REVOKE_TWO_JOBS (UINT64_C(1) << 63)

enum { T_HB = 1, T_FAILED = 2, T_REVOKE = 3, T_BYE = 4, T_JOIN = 5, T_PENDING = 6,
       T_AGREE_QUERY = 7 };

/* Agreements this rank decided, kept for a coordinator that asks after
 * its predecessor failed (loomi_ctrl_agreed_put): the last few only,
 * as ranks are never more than one agreement apart. */
#define AGREED_KEEP 4

/* Joiner slots (after the n ranks in `p`): states. */
enum { J_FREE = 0, J_AUTH, J_HELLO, J_PENDING, J_ADMITTED, J_CLOSING };
/* A joiner must prove it holds the job's key (J_AUTH, auth.h) and say
 * what it wants this soon after connecting. */
#define JOIN_HELLO_MS 2000

struct peer {
    int fd;
    unsigned mb_held;  /* its messages in the mailbox (loomi_ctrl_mail_bad) */
    uint64_t mb_bytes; /* and their payload bytes */
    int failed, bye;
    int jstate; /* joiner slots only (J_*) */
    struct loomi_auth_accept auth; /* joiner slots: the handshake (J_AUTH) */
    uint64_t jsince; /* when it connected, or was marked pending (arrival order) */
    uint64_t last_heard_ms;
    unsigned char *in;
    size_t in_len, in_cap;
    unsigned char *out;
    size_t out_off, out_len, out_cap;
    /* Sealed (LOOM_ENCRYPT; ranks' connections only, not joiners'):
     * each direction's records (stx.ctx NULL: plain), and whether the
     * header record at in[0] is opened already. */
    struct loomi_seal stx, srx;
    int hopen;
};

struct loomi_ctrl {
    int rank, n;
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    int hb_ms;
    int sealed; /* LOOM_ENCRYPT: ranks' connections sealed (loomi_ctrl_set_sealed) */
    int lfd;
    uint64_t nonce;
    struct sockaddr_storage laddr;
    socklen_t laddr_len;
    pthread_t thread;
    int started;
    int wake[2];

    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int revoked;
    loom_result_t code;
    int failed_rank;
    char why[256];
    unsigned gen;
    int stop;
    struct peer *p; /* [n + LOOMI_CTRL_MAX_JOINERS]: ranks, then joiner slots */
    struct loomi_cmsg *mb_head, *mb_tail;
    atomic_uint mb_count; /* messages ever put in the mailbox */

    /* Join service: held by the lowest rank alive, on the job's
     * rendezvous address, which it binds once the bootstrap root (or the
     * previous holder) has let go of it. */
    int serve;
    int keyed; /* the job has a key of its own (loomi_ctrl_serve_joins) */
    struct sockaddr_storage jaddr;
    socklen_t jaddr_len;
    int jfd;
    uint64_t next_bind_ms;
    uint64_t jpause_until; /* out of descriptors: accept no joiner before then */
    int npending;
    atomic_int pending_seen; /* the holder's count, as last heard */

    /* Until then this rank does not pass failures on: its thread was
     * not running (the process was stopped or starved), so its view is
     * stale until it has heard the others again. */
    uint64_t quiet_until;
    struct {
        uint64_t id;
        uint32_t len;
        unsigned char *msg; /* the decision's payload, as sent */
    } agreed[AGREED_KEEP];
    unsigned agreed_next;
};

/* ------------------------------------------------------------ encoding */

static inline void put32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static inline void put64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t get32(const unsigned char *b)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i);
    return v;
}
static inline uint64_t get64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static inline void wake(struct loomi_ctrl *c)
{
    char b = 1;
    ssize_t w = write(c->wake[1], &b, 1);
    (void)w; /* a full pipe already wakes the thread */
}

/* Wait on cv (under mu) for at most ms milliseconds. */
static inline void cv_wait_ms(struct loomi_ctrl *c, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

/* ----------------------------------------------------- in ctrl.c */

/* Append one message to a peer's output, or to every rank's (under mu). */
int loomi_ctrl_queue_msg(struct loomi_ctrl *c, int q, uint16_t type, uint32_t epoch, uint64_t arg,
                         const void *data, uint32_t len);
void loomi_ctrl_queue_all(struct loomi_ctrl *c, uint16_t type, uint64_t arg);
/* The first reason the communicator is revoked for (under mu). */
void loomi_ctrl_set_revoked(struct loomi_ctrl *c, loom_result_t code, int failed, const char *why);
/* Declare q failed (under mu): first reason revokes, every peer hears. */
void loomi_ctrl_fail_peer(struct loomi_ctrl *c, int q, const char *why);
/* Send q the decision of agreement id, if this rank has it (under mu). */
int loomi_ctrl_answer_agreed(struct loomi_ctrl *c, int q, uint64_t id);

#endif
