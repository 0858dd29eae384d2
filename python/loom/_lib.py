"""Finding and loading libloom, and the C prototypes (ctypes).

The library is looked for, in this order, at:

1. ``LOOM_LIBRARY``, a path to ``libloom.so*`` (the tests name the one
   of the build tree with it);
2. the directory ``make install`` recorded in ``loom/_install.py`` when
   it installed this package next to the library;
3. the dynamic linker's search path (``libloom.so.0``).

Functions are called through :class:`ctypes.CDLL`, which releases the
GIL for the duration of every call.
"""
import ctypes
import os

__all__ = ["lib", "path"]

c_int, c_uint, c_size_t, c_void_p, c_char_p = (ctypes.c_int, ctypes.c_uint,
                                                ctypes.c_size_t, ctypes.c_void_p,
                                                ctypes.c_char_p)
c_uint64 = ctypes.c_uint64
P = ctypes.POINTER
SONAME = "libloom.so.0"


class Config(ctypes.Structure):
    """loom_config_t."""
    _fields_ = [("size", c_size_t), ("version", c_uint), ("timeout_ms", c_int),
                ("tcp_streams", c_int), ("chunk_bytes", c_size_t),
                ("socket_ifname", c_char_p), ("algo", c_char_p), ("transport", c_char_p)]


class CollOptions(ctypes.Structure):
    """loom_coll_options_t."""
    _fields_ = [("size", c_size_t), ("codec", c_void_p), ("state", c_void_p),
                ("key", c_uint64)]


class Tensor(ctypes.Structure):
    """loom_tensor_t."""
    _fields_ = [("data", c_void_p), ("bytes", c_size_t)]


# The function table of struct loom_codec (loom_codec_register(3)).  The
# codec pointer each function gets is a c_void_p: read it through
# POINTER(CodecTable).
CODEC_CONFIGURE = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, P(c_void_p))
CODEC_MAX_ENCODED_BYTES = ctypes.CFUNCTYPE(c_size_t, c_void_p, c_size_t)
CODEC_ENCODE = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t,
                                P(c_size_t))
CODEC_DECODE = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t)
CODEC_REDUCE_ENCODED = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_size_t)


class CodecTable(ctypes.Structure):
    """struct loom_codec (loom_codec_t)."""
    _fields_ = [("size", c_size_t), ("name", c_char_p), ("props", c_uint), ("user", c_void_p),
                ("params", c_void_p), ("configure", CODEC_CONFIGURE),
                ("max_encoded_bytes", CODEC_MAX_ENCODED_BYTES), ("encode", CODEC_ENCODE),
                ("decode", CODEC_DECODE), ("decode_accumulate", CODEC_DECODE),
                ("reduce_encoded", CODEC_REDUCE_ENCODED)]


UNIQUE_ID_BYTES = 128


class UniqueIdStruct(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


def _candidates():
    env = os.environ.get("LOOM_LIBRARY")
    if env:
        return [env], "LOOM_LIBRARY"
    try:
        from . import _install  # written by make install
    except ImportError:
        _install = None
    if _install is not None:
        return [os.path.join(_install.LIBDIR, SONAME)], "the installed libdir"
    return [SONAME], "the dynamic linker's path"


def _load():
    names, where = _candidates()
    errors = []
    for n in names:
        try:
            return ctypes.CDLL(n), n
        except OSError as e:
            errors.append(str(e))
    raise ImportError("loom: cannot load libloom from %s (%s): %s"
                      % (where, ", ".join(names), "; ".join(errors)))


lib, path = _load()

R = c_int  # loom_result_t
COMM = c_void_p
REQ = c_void_p
_DT_OP = [c_int, c_int]

_PROTOS = {
    "loom_strerror": (c_char_p, [c_int]),
    "loom_get_last_error": (c_char_p, []),
    "loom_get_version": (R, [P(c_int), P(c_int), P(c_int)]),
    "loom_datatype_size": (c_size_t, [c_int]),
    "loom_config_init": (R, [P(Config)]),
    "loom_get_unique_id": (R, [P(UniqueIdStruct)]),
    "loom_comm_init_rank": (R, [P(COMM), c_int, P(UniqueIdStruct), c_int, P(Config)]),
    "loom_comm_init_env": (R, [P(COMM), P(Config)]),
    "loom_comm_destroy": (R, [COMM]),
    "loom_comm_abort": (R, [COMM]),
    "loom_comm_rank": (R, [COMM, P(c_int)]),
    "loom_comm_size": (R, [COMM, P(c_int)]),
    "loom_comm_set_algo": (R, [COMM, c_char_p]),
    "loom_comm_get_error": (R, [COMM, P(c_int)]),
    "loom_comm_revoke": (R, [COMM]),
    "loom_comm_get_failed": (R, [COMM, P(c_int), c_int, P(c_int)]),
    "loom_comm_shrink": (R, [COMM, P(COMM)]),
    "loom_comm_split": (R, [COMM, c_int, c_int, P(Config), P(COMM)]),
    "loom_comm_create_group": (R, [COMM, c_int, P(c_int), c_int, P(COMM)]),
    "loom_comm_agree": (R, [COMM, P(c_uint64), c_int]),
    "loom_comm_join": (R, [P(COMM), P(Config)]),
    "loom_comm_pending_joins": (R, [COMM, P(c_int)]),
    "loom_comm_grow": (R, [COMM, P(COMM)]),
    "loom_state_sync": (R, [COMM, P(Tensor), c_int, P(c_uint64)]),
    "loom_mem_register": (R, [COMM, c_void_p, c_size_t, P(c_void_p)]),
    "loom_mem_deregister": (R, [COMM, c_void_p]),
    "loom_mem_alloc": (R, [COMM, c_size_t, P(c_void_p)]),
    "loom_mem_free": (R, [COMM, c_void_p]),
    "loom_wait": (R, [P(REQ)]),
    "loom_wait_any": (R, [P(REQ), c_int, P(c_int)]),
    "loom_wait_all": (R, [P(REQ), c_int]),
    "loom_test": (R, [P(REQ), P(c_int)]),
    "loom_allreduce": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP + [COMM]),
    "loom_iallreduce": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP + [COMM, P(REQ)]),
    "loom_allreduce_opts": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP + [COMM, P(CollOptions)]),
    "loom_iallreduce_opts": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP
                             + [COMM, P(CollOptions), P(REQ)]),
    "loom_reduce_scatter": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP + [COMM]),
    "loom_ireduce_scatter": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP + [COMM, P(REQ)]),
    "loom_allgather": (R, [c_void_p, c_void_p, c_size_t, c_int, COMM]),
    "loom_iallgather": (R, [c_void_p, c_void_p, c_size_t, c_int, COMM, P(REQ)]),
    "loom_reduce_scatter_opts": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP
                                 + [COMM, P(CollOptions)]),
    "loom_ireduce_scatter_opts": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP
                                  + [COMM, P(CollOptions), P(REQ)]),
    "loom_allgather_opts": (R, [c_void_p, c_void_p, c_size_t, c_int, COMM, P(CollOptions)]),
    "loom_iallgather_opts": (R, [c_void_p, c_void_p, c_size_t, c_int, COMM, P(CollOptions),
                                 P(REQ)]),
    "loom_alltoall": (R, [c_void_p, c_void_p, c_size_t, c_int, COMM]),
    "loom_ialltoall": (R, [c_void_p, c_void_p, c_size_t, c_int, COMM, P(REQ)]),
    "loom_alltoallv": (R, [c_void_p, P(c_size_t), P(c_size_t), c_void_p, P(c_size_t),
                           P(c_size_t), c_int, COMM]),
    "loom_ialltoallv": (R, [c_void_p, P(c_size_t), P(c_size_t), c_void_p, P(c_size_t),
                            P(c_size_t), c_int, COMM, P(REQ)]),
    "loom_broadcast": (R, [c_void_p, c_void_p, c_size_t, c_int, c_int, COMM]),
    "loom_ibroadcast": (R, [c_void_p, c_void_p, c_size_t, c_int, c_int, COMM, P(REQ)]),
    "loom_reduce": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP + [c_int, COMM]),
    "loom_ireduce": (R, [c_void_p, c_void_p, c_size_t] + _DT_OP + [c_int, COMM, P(REQ)]),
    "loom_gather": (R, [c_void_p, c_void_p, c_size_t, c_int, c_int, COMM]),
    "loom_igather": (R, [c_void_p, c_void_p, c_size_t, c_int, c_int, COMM, P(REQ)]),
    "loom_scatter": (R, [c_void_p, c_void_p, c_size_t, c_int, c_int, COMM]),
    "loom_iscatter": (R, [c_void_p, c_void_p, c_size_t, c_int, c_int, COMM, P(REQ)]),
    "loom_barrier": (R, [COMM]),
    "loom_gossip_average": (R, [c_void_p, c_size_t, c_int, c_int, c_uint64, COMM]),
    "loom_igossip_average": (R, [c_void_p, c_size_t, c_int, c_int, c_uint64, COMM, P(REQ)]),
    "loom_gossip_partner": (R, [COMM, c_uint64, P(c_int)]),
    "loom_ibarrier": (R, [COMM, P(REQ)]),
    "loom_send": (R, [c_void_p, c_size_t, c_int, c_int, COMM]),
    "loom_recv": (R, [c_void_p, c_size_t, c_int, c_int, COMM]),
    "loom_isend": (R, [c_void_p, c_size_t, c_int, c_int, COMM, P(REQ)]),
    "loom_irecv": (R, [c_void_p, c_size_t, c_int, c_int, COMM, P(REQ)]),
    "loom_group_start": (R, []),
    "loom_group_end": (R, []),
    "loom_codec_register": (R, [P(CodecTable)]),
    "loom_codec_find": (R, [c_char_p, P(c_void_p)]),
    "loom_codec_max_encoded_bytes": (R, [c_void_p, c_size_t, P(c_size_t)]),
    "loom_codec_encode": (R, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t,
                              P(c_size_t), c_void_p]),
    "loom_codec_decode": (R, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t]),
    "loom_codec_decode_accumulate": (R, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t]),
    "loom_codec_reduce_encoded": (R, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "loom_codec_encode_ef": (R, [c_void_p, c_void_p, c_uint64, c_size_t, c_size_t, c_void_p,
                                 c_size_t, c_void_p, c_size_t, P(c_size_t), c_void_p]),
    "loom_codec_state_create": (R, [P(c_void_p)]),
    "loom_codec_state_destroy": (R, [c_void_p]),
    "loom_codec_state_commit": (R, [c_void_p, c_uint64]),
    "loom_codec_state_rollback": (R, [c_void_p, c_uint64]),
    "loom_codec_state_reset": (R, [c_void_p, c_uint64]),
    "loom_codec_state_residual": (R, [c_void_p, c_uint64, c_void_p, c_size_t]),
    "loom_comm_set_codec": (R, [COMM, c_void_p]),
}

for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args
del _name, _res, _args, _f
