/* error.c - result codes, per-thread detailed messages. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Per thread, so that two threads on two communicators never see each
 * other's messages. */
static _Thread_local char last_error[512];

const char *loom_strerror(loom_result_t r)
{
    switch (r) {
    case LOOM_SUCCESS: return "success";
    case LOOM_ERR_SYSTEM: return "system call failed";
    case LOOM_ERR_INTERNAL: return "internal error";
    case LOOM_ERR_INVALID_ARGUMENT: return "invalid argument";
    case LOOM_ERR_INVALID_USAGE: return "invalid usage";
    case LOOM_ERR_REMOTE: return "remote peer failed";
    case LOOM_IN_PROGRESS: return "operation in progress";
    case LOOM_ERR_TIMEOUT: return "timed out";
    case LOOM_ERR_NO_MEMORY: return "out of memory";
    case LOOM_ERR_REVOKED: return "communicator revoked";
    case LOOM_ERR_UNSUPPORTED: return "unsupported";
    case LOOM_ERR_MISMATCH: return "peers disagree (job, size, version, settings or collective calls)";
    case LOOM_ERR_CONNECT: return "connection failed";
    }
    return "unknown result code";
}

const char *loom_get_last_error(void) { return last_error; }

void loomi_clear_error(void) { last_error[0] = '\0'; }

loom_result_t loomi_fail(loom_result_t code, int rank, const char *fmt, ...)
{
    /* Formatted aside first: callers pass loom_get_last_error() to
     * prefix the cause, and formatting a buffer into itself is undefined
     * (it came out as "...: ailed: the peer aborted ..."). */
    char msg[sizeof last_error];
    LOOMI_VFORMAT(msg, fmt);
    memcpy(last_error, msg, strlen(msg) + 1);
    LOOMI_WARN(rank, "%s (%s)", last_error, loom_strerror(code));
    return code;
}

loom_result_t loom_get_version(int *major, int *minor, int *patch)
{
    if (major) *major = LOOM_VERSION_MAJOR;
    if (minor) *minor = LOOM_VERSION_MINOR;
    if (patch) *patch = LOOM_VERSION_PATCH;
    return LOOM_SUCCESS;
}

size_t loom_datatype_size(loom_datatype_t dt)
{
    switch (dt) {
    case LOOM_INT8: case LOOM_UINT8: return 1;
    case LOOM_FLOAT16: case LOOM_BFLOAT16: return 2;
    case LOOM_INT32: case LOOM_UINT32: case LOOM_FLOAT32: return 4;
    case LOOM_INT64: case LOOM_UINT64: case LOOM_FLOAT64: return 8;
    default: return 0;
    }
}

const char *loomi_dtype_name(loom_datatype_t dt)
{
    static const char *const names[] = {"int8", "uint8", "int32", "uint32",
                                        "int64", "uint64", "float16", "float32",
                                        "float64", "bfloat16"};
    return (unsigned)dt < LOOMI_ARRAY_LEN(names) ? names[dt] : "invalid";
}

const char *loomi_op_name(loom_op_t op)
{
    static const char *const names[] = {"sum", "prod", "max", "min", "avg"};
    return (unsigned)op < LOOMI_ARRAY_LEN(names) ? names[op] : "invalid";
}
