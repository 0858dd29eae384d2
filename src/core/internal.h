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

#include "loom.h"

#define LOOMI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define LOOMI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LOOMI_MAX(a, b) ((a) > (b) ? (a) : (b))

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
};

/* NULL-safe: returns the parsed environment or, when a variable holds a
 * bad value, sets the last error (naming it) and returns NULL. */
const struct loomi_env *loomi_env_get(void);

/* Parse "123", "4K", "2M", "1G" (powers of 1024).  Returns 0 on success. */
int loomi_parse_size(const char *s, size_t *out);

/* Per-communicator settings: environment merged with a loom_config_t. */
struct loomi_settings {
    int timeout_ms;
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
};

loom_result_t loomi_settings_resolve(struct loomi_settings *out,
                                     const loom_config_t *cfg,
                                     const char *caller);

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
