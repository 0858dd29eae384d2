"""Loom from Python: collectives over NumPy arrays and torch CPU tensors.

    import loom, numpy as np
    comm = loom.Communicator.from_env()        # under loomrun or torchrun
    x = np.full(4, comm.rank, dtype=np.float32)
    comm.allreduce(x, "avg")                   # in place, zero-copy

``import loom.torch`` registers the torch.distributed backend "loom".
The library is libloom through ctypes (the one installed with this
package, or LOOM_LIBRARY).  See loom-python(7).
"""
from ._core import (  # noqa: F401
    AVG, BFLOAT16, CODEC_ADDITIVE, CODEC_DECODE_REDUCE, CODEC_GATHER_ONLY, ERR_CONNECT,
    ERR_INTERNAL, ERR_INVALID_ARGUMENT, ERR_INVALID_USAGE, ERR_MISMATCH, ERR_NO_MEMORY,
    ERR_REMOTE, ERR_REVOKED, ERR_SYSTEM, ERR_TIMEOUT, ERR_UNSUPPORTED, FLOAT16, FLOAT32,
    FLOAT64, GOSSIP_SEEDED, INT8, INT32, INT64, MAX, MIN, PROD, REVISION_NONE, SPLIT_NOCOLOR, SUCCESS, SUM,
    UINT8, UINT32, UINT64, Codec, CodecState, Communicator, ConnectError, Error, InternalError,
    InvalidArgument, InvalidUsage, MismatchError, NoMemoryError, Registration, RemoteError,
    Request, RevokedError, SystemCallError, TimeoutError, UnsupportedError, Window,
    get_unique_id, group, register_codec, strerror, version, wait_all, wait_any)
from ._lib import path as library_path  # noqa: F401

__version__ = "%d.%d.%d" % version()
