/*
 * uniform.c - the settings every rank of a communicator must share, and
 * the message that names the one that differs (comm.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

/* A tuning file is a few hundred bytes; more is not one. */
#define TUNING_MAX_BYTES (1u << 20)

static void hash_file(const char *path, struct loomi_uniform *u)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = malloc(TUNING_MAX_BYTES);
    size_t len = 0;
    u->tuning = 2;
    if (f && buf) {
        len = fread(buf, 1, TUNING_MAX_BYTES, f);
        if (!ferror(f)) {
            u->tuning = 1;
            u->tuning_hash = loomi_hash64(buf, len, 0x6c6f6f6d74756e65ull);
        }
    }
    if (f) fclose(f);
    free(buf);
}

void loomi_uniform_fill(struct loomi_uniform *u, const struct loomi_settings *s,
                        const int *algo_forced, unsigned route_mask, int with_tuning)
{
    memset(u, 0, sizeof *u);
    u->chunk_bytes = s->chunk_fixed ? s->chunk_bytes : 0;
    u->shm_bytes = s->shm_bytes;
    u->shm_small = s->shm_small;
    u->shm_stream = s->shm_stream;
    u->shm_cma = s->shm_cma_fixed ? s->shm_cma_min : UINT64_MAX;
    u->probe = s->probe;
    u->shm_stream_saves = s->shm_stream_saves;
    u->shm_stream_copyin = s->shm_stream_copyin;
    u->heartbeat_ms = s->heartbeat_ms;
    u->tcp_streams = s->tcp_streams;
    u->quorum_any = s->quorum_any;
    u->encrypt = s->encrypt;
    u->route_mask = route_mask;
    for (int k = 0; k < LOOMI_MAX_COLLS; k++) u->algo[k] = (int8_t)algo_forced[k];
    snprintf(u->transport, sizeof u->transport, "%s", s->transport);
    if (with_tuning && s->tuning_file[0]) hash_file(s->tuning_file, u);
}

/* "64K" for a whole number of K, M or G; else the bytes. */
static const char *size_str(uint64_t v, char *b, size_t n)
{
    static const char unit[] = "KMG";
    int k = -1;
    while (k < 2 && v && v % 1024 == 0) {
        v /= 1024;
        k++;
    }
    if (k < 0) snprintf(b, n, "%llu", (unsigned long long)v);
    else snprintf(b, n, "%llu%c", (unsigned long long)v, unit[k]);
    return b;
}

static const char *chunk_str(uint64_t v, char *b, size_t n)
{
    return v ? size_str(v, b, n) : "unset (the model chooses)";
}

static const char *cma_str(uint64_t v, char *b, size_t n)
{
    return v == UINT64_MAX ? "unset" : v ? size_str(v, b, n) : "0 (never)";
}

static const char *stores_str(int32_t v)
{
    return v < 0 ? "-1 (measured)" : v ? "1" : "0";
}

static const char *algo_str(int8_t a)
{
    return a == LOOMI_ALGO_AUTO ? "automatic" : loomi_algo_name(a);
}

static const char *tuning_str(const struct loomi_uniform *u, char *b, size_t n)
{
    if (u->tuning == 0) return "unset";
    if (u->tuning == 2) return "a file it could not read";
    snprintf(b, n, "a file whose content hashes to %016llx", (unsigned long long)u->tuning_hash);
    return b;
}

int loomi_uniform_diff(const struct loomi_uniform *a, const char *who_a,
                       const struct loomi_uniform *b, const char *who_b, char *msg, size_t n)
{
    char x[80], y[80];
    const char *name = NULL, *va = NULL, *vb = NULL;
#define SIZE(field, var)                                                   \
    if (!name && a->field != b->field) {                                   \
        name = var;                                                        \
        va = size_str(a->field, x, sizeof x);                              \
        vb = size_str(b->field, y, sizeof y);                              \
    }
#define STORES(field, var)                                                 \
    if (!name && a->field != b->field) {                                   \
        name = var;                                                        \
        va = stores_str(a->field);                                         \
        vb = stores_str(b->field);                                         \
    }
#define NUM(field, var)                                                    \
    if (!name && a->field != b->field) {                                   \
        name = var;                                                        \
        snprintf(x, sizeof x, "%d", (int)a->field);                        \
        snprintf(y, sizeof y, "%d", (int)b->field);                        \
        va = x;                                                            \
        vb = y;                                                            \
    }
    if (a->chunk_bytes != b->chunk_bytes) {
        name = "LOOM_CHUNK_SIZE";
        va = chunk_str(a->chunk_bytes, x, sizeof x);
        vb = chunk_str(b->chunk_bytes, y, sizeof y);
    }
    for (int k = 0; !name && k < LOOMI_NUM_COLLS; k++)
        if (a->algo[k] != b->algo[k]) {
            snprintf(msg, n,
                     "LOOM_ALGO differs between ranks: the %s is %s on %s and %s on %s; it "
                     "must be the same on every rank",
                     loomi_coll_name(k), algo_str(a->algo[k]), who_a, algo_str(b->algo[k]),
                     who_b);
            return 1;
        }
    if (!name && a->route_mask != b->route_mask) {
        /* Bounded: a block from the network need not end in a NUL. */
        name = "LOOM_TRANSPORT";
        snprintf(x, sizeof x, "%.*s", (int)sizeof a->transport, a->transport);
        snprintf(y, sizeof y, "%.*s", (int)sizeof b->transport, b->transport);
        va = x[0] ? x : "unset (every transport)";
        vb = y[0] ? y : "unset (every transport)";
    }
    SIZE(shm_bytes, "LOOM_SHM_SIZE")
    SIZE(shm_small, "LOOM_SHM_SMALL")
    SIZE(shm_stream, "LOOM_SHM_STREAM")
    if (!name && a->shm_cma != b->shm_cma) {
        /* Which path a message takes is the sender's choice, but the
         * probe's two ends must agree on the size that prices it. */
        name = "LOOM_SHM_CMA";
        va = cma_str(a->shm_cma, x, sizeof x);
        vb = cma_str(b->shm_cma, y, sizeof y);
    }
    STORES(shm_stream_saves, "LOOM_SHM_STREAM_SAVES")
    STORES(shm_stream_copyin, "LOOM_SHM_STREAM_COPYIN")
    NUM(probe, "LOOM_PROBE")
    NUM(heartbeat_ms, "LOOM_HEARTBEAT_MS")
    NUM(tcp_streams, "LOOM_TCP_STREAMS")
    NUM(encrypt, "LOOM_ENCRYPT")
    if (!name && a->quorum_any != b->quorum_any) {
        name = "LOOM_QUORUM";
        va = a->quorum_any ? "any" : "majority";
        vb = b->quorum_any ? "any" : "majority";
    }
    if (!name && (a->tuning != b->tuning || a->tuning_hash != b->tuning_hash)) {
        name = "LOOM_TUNING_FILE";
        va = tuning_str(a, x, sizeof x);
        vb = tuning_str(b, y, sizeof y);
    }
#undef SIZE
#undef STORES
#undef NUM
    if (!name) return 0;
    snprintf(msg, n, "%s differs between ranks: %s on %s and %s on %s; it must be the same on "
             "every rank", name, va, who_a, vb, who_b);
    return 1;
}
