/*
 * internal.h - what every part of the library shares: errors, logging,
 * configuration, time.  Internal names are loomi_*.
 */
#ifndef LOOMI_INTERNAL_H
#define LOOMI_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom.h"

#define LOOMI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define LOOMI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LOOMI_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Every formatting helper's varargs idiom: the text of its own fmt and
 * the arguments after it, into the array (or array member) buf; fmt must
 * be the helper's last named parameter. */
#define LOOMI_VFORMAT(buf, fmt)                                                \
    do {                                                                       \
        va_list ap_;                                                           \
        va_start(ap_, fmt);                                                    \
        vsnprintf(buf, sizeof(buf), fmt, ap_);                                 \
        va_end(ap_);                                                           \
    } while (0)

#if defined(__GNUC__)
#define LOOMI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define LOOMI_PRINTF(f, a)
#endif

/* ------------------------------------------------------------- logging */

/*
 * Levels, lowest first.  Unset LOOM_DEBUG means LOOMI_LOG_NOTICE: only
 * what no call returns (a degraded topology, a progress thread that did
 * not start) is printed, since the application prints every error a call
 * returns (loom_get_last_error).  LOOM_DEBUG=warn adds the library's own
 * line for each failure, as it happens (loomi_fail, a peer lost).
 */
enum loomi_log_level {
    LOOMI_LOG_NONE = 0,
    LOOMI_LOG_NOTICE = 1,
    LOOMI_LOG_WARN = 2,
    LOOMI_LOG_INFO = 3,
    LOOMI_LOG_TRACE = 4
};

/* Current level (LOOM_DEBUG), read once. */
int loomi_log_level(void);
void loomi_log_write(int level, int rank, const char *fmt, ...)
    LOOMI_PRINTF(3, 4);

#define LOOMI_LOG(lvl, rank, ...)                                              \
    do {                                                                       \
        if (loomi_log_level() >= (lvl))                                        \
            loomi_log_write((lvl), (rank), __VA_ARGS__);                       \
    } while (0)
/* A warning about something no call will return: printed by default. */
#define LOOMI_NOTICE(rank, ...) LOOMI_LOG(LOOMI_LOG_NOTICE, rank, __VA_ARGS__)
/* Why a call fails or a peer is lost (the caller gets an error too):
 * printed from LOOM_DEBUG=warn on. */
#define LOOMI_WARN(rank, ...) LOOMI_LOG(LOOMI_LOG_WARN, rank, __VA_ARGS__)
#define LOOMI_INFO(rank, ...) LOOMI_LOG(LOOMI_LOG_INFO, rank, __VA_ARGS__)
#define LOOMI_TRACE(rank, ...) LOOMI_LOG(LOOMI_LOG_TRACE, rank, __VA_ARGS__)

/* --------------------------------------------------------------- errors */

/* Record the calling thread's detailed error (loom_get_last_error), log it
 * at warn level with the rank (-1 when none) and return `code`. */
loom_result_t loomi_fail(loom_result_t code, int rank, const char *fmt, ...)
    LOOMI_PRINTF(3, 4);
/* Same, keeping an already-recorded message (used when an inner call has
 * set it and the outer one only passes the code on). */
void loomi_clear_error(void);

/* ----------------------------------------------------------- config */

/* Process-wide settings from the environment, parsed once (read-only
 * afterwards, so communicators cannot trample each other).  A loom_config_t
 * given to init overrides them per communicator. */
struct loomi_env {
    int timeout_ms;
    int timeout_src;           /* LOOM_TIMEOUT: 0 unset, 1 with a unit, 2 a bare number */
    int spin_us;
    int tcp_streams;
    size_t tcp_sockbuf;
    size_t chunk_bytes;
    int chunk_fixed;           /* LOOM_CHUNK_SIZE was set: no chunk from the model */
    int shm_cma_fixed;         /* LOOM_SHM_CMA was set: kept when ranks share cores */
    const char *socket_ifname; /* NULL: automatic */
    const char *algo;          /* NULL: automatic */
    const char *transport;     /* NULL: any */
    const char *topo_file;     /* hwloc XML instead of this machine (tests) */
    const char *hostname;      /* host identity override (tests) */
    const char *tuning_file;   /* link parameters instead of measuring them */
    int probe;                 /* measure links at init */
    size_t shm_bytes;          /* shared-memory arena per rank */
    size_t shm_cma_min;        /* single-copy (CMA) from this size on; 0: never */
    size_t shm_small;          /* allreduce through arena slots up to this size; 0: never */
    size_t shm_stream;         /* shared allreduce streams results from this many vector
                                * bytes on the host; 0: never */
    int shm_stream_saves;      /* in place past shm_stream: -1 measure, 0 cached, 1 streamed */
    int shm_stream_copyin;     /* shared copy-in: -1 measure per size, 0 cached, 1 streamed */
    int heartbeat_ms;          /* control-plane heartbeat period; 0: none */
    int progress_thread;       /* 1: a thread progresses non-blocking operations */
    const char *quorum;        /* LOOM_QUORUM: "majority" (NULL) or "any" */
    int cuda_ipc;              /* LOOM_CUDA_IPC: device buffers between a host's ranks */
    const char *gpudirect;     /* LOOM_GPUDIRECT: "auto" (NULL), "0" or "1" */
    int encrypt;               /* LOOM_ENCRYPT: 1 seals tcp and control records (AEAD) */
    int stats;                 /* LOOM_STATS: 1 records straggler telemetry */
    size_t cuda_pipe_chunk;    /* LOOM_CUDA_PIPELINE_CHUNK: device collectives staged in
                                * chunks of this many bytes, pipelined; 0: whole */
};

/* NULL-safe: returns the parsed environment or, when a variable holds a
 * bad value, sets the last error (naming it) and returns NULL. */
const struct loomi_env *loomi_env_get(void);

/* Parse "123", "4K", "2M", "1G" (powers of 1024).  Returns 0 on success. */
int loomi_parse_size(const char *s, size_t *out);
/* Parse a duration into a whole number of units of unit_us microseconds
 * (1000: milliseconds): a bare number is in those units; else a decimal
 * number ("1.5") and a unit, us, ms, s or m.  Returns 0 on success, -1
 * for garbage, a negative value, overflow or a value that is not a whole
 * number of units. */
int loomi_parse_duration(const char *s, long long unit_us, long long *out);

/* Per-communicator settings: environment merged with a loom_config_t. */
struct loomi_settings {
    int timeout_ms;
    int timeout_src; /* 0 default, LOOM_TIMEOUT with a unit 1 or bare 2, 3 cfg->timeout_ms */
    int spin_us;
    int tcp_streams;
    size_t tcp_sockbuf;
    size_t chunk_bytes;
    int chunk_fixed; /* set by LOOM_CHUNK_SIZE or the config: the model picks none */
    char socket_ifname[64];
    char algo[256];
    char transport[64];
    char topo_file[256];
    char hostname[64];
    char tuning_file[256];
    int probe;
    size_t shm_bytes;
    size_t shm_cma_min;
    int shm_cma_fixed;
    size_t shm_small;
    size_t shm_stream;
    int shm_stream_saves;
    int shm_stream_copyin;
    int heartbeat_ms;
    int progress_thread;
    int quorum_any; /* LOOM_QUORUM=any: any survivors may go on, not only a majority */
    int encrypt;    /* LOOM_ENCRYPT=1: tcp streams and control frames sealed (AES-256-GCM) */
    int stats;      /* LOOM_STATS=1: straggler telemetry (loom_comm_get_stats) */
    int cuda_ipc;   /* LOOM_CUDA_IPC=1: device-direct collectives on one host (devpeer.c) */
    int gpudirect;  /* LOOM_GPUDIRECT: LOOMI_GPUDIRECT_* (verbs' dmabuf registrations) */
};

/* LOOM_GPUDIRECT: device memory registered with the NIC through dmabuf
 * never (OFF), where the driver and NIC accept it (AUTO), or as a must
 * (ON: a refusal is an error). */
enum { LOOMI_GPUDIRECT_OFF = 0, LOOMI_GPUDIRECT_ON = 1, LOOMI_GPUDIRECT_AUTO = 2 };

loom_result_t loomi_settings_resolve(struct loomi_settings *out,
                                     const loom_config_t *cfg,
                                     const char *caller);
/* The deadline as messages name it: "LOOM_TIMEOUT=60000 ms", and for a
 * deadline under a second a word on it ("LOOM_TIMEOUT=20 ms (did you
 * mean 20s? ...)"). */
void loomi_timeout_str(const struct loomi_settings *s, char *buf, size_t n);

/* --------------------------------------------------------- handles */

/* What the application holds for a communicator or a request is a slot
 * of a table and the slot's generation, not an address (handle.c): a
 * handle stays refused after its object is gone, whatever address a new
 * object gets.  Thread-safe; lookups take no lock. */
enum loomi_handle_kind { LOOMI_HANDLE_COMM = 0, LOOMI_HANDLE_REQUEST = 1 };
enum loomi_handle_state {
    LOOMI_HANDLE_LIVE,  /* names an object */
    LOOMI_HANDLE_NULL,  /* 0 */
    LOOMI_HANDLE_GONE,  /* named one that was released since */
    LOOMI_HANDLE_NEVER  /* was never a handle of this kind */
};
/* A new handle for obj (which may be NULL: reserved, set later); 0 when
 * the table is full or out of memory. */
uintptr_t loomi_handle_new(enum loomi_handle_kind kind, void *obj);
void loomi_handle_set(enum loomi_handle_kind kind, uintptr_t h, void *obj);
/* The object h names, or NULL (then *why, when given, says why). */
void *loomi_handle_get(enum loomi_handle_kind kind, uintptr_t h, enum loomi_handle_state *why);
/* Release h: from now on it names nothing (a second drop does nothing). */
void loomi_handle_drop(enum loomi_handle_kind kind, uintptr_t h);

/* ------------------------------------------------------------ guard */

/* While a communicator is connected (shrink, grow, join), a member of it
 * may die: the waits for its connections would then last until the
 * deadline, though the membership has already moved on.  The calling
 * thread sets a guard around them (util.c): fn(arg) says, with the
 * reason in msg, that the communicator being connected is doomed.  The
 * waits of connections (net.c, the transports, the control plane) ask
 * loomi_guard_stop every few milliseconds and give up with its reason.
 * Thread-local; fn NULL clears it. */
typedef int (*loomi_guard_fn)(void *arg, char *msg, size_t n);
void loomi_guard_set(loomi_guard_fn fn, void *arg);
/* 0, or nonzero with the reason in msg (once stopped, it stays so until
 * the guard is set again). */
int loomi_guard_stop(char *msg, size_t n);

/* ------------------------------------------------------------ time */

/* Monotonic clock in nanoseconds / milliseconds. */
uint64_t loomi_now_ns(void);
static inline uint64_t loomi_now_ms(void) { return loomi_now_ns() / 1000000u; }

/* Milliseconds left until deadline_ms (0 when passed), clamped to INT_MAX. */
int loomi_ms_left(uint64_t deadline_ms);

/* qsort comparison of doubles, ascending (timings' quantiles). */
int loomi_cmp_double(const void *a, const void *b);

/* len bytes, on huge pages where the kernel gives them (util.c); free()
 * releases them. */
void *loomi_big_alloc(size_t len);

/* XXH64 of len bytes (hash.c). */
uint64_t loomi_hash64(const void *data, size_t len, uint64_t seed);

/* Names for messages. */
const char *loomi_dtype_name(loom_datatype_t dt);
const char *loomi_op_name(loom_op_t op);

#endif
