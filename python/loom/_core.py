"""The loom package's classes over libloom (see loom-python(7))."""
import builtins
import contextlib
import ctypes
import functools
import gc
import os
import threading
import weakref

from . import _lib
from ._lib import lib

byref = ctypes.byref

# ---------------------------------------------------------------- constants
SUCCESS = 0
ERR_SYSTEM = 2
ERR_INTERNAL = 3
ERR_INVALID_ARGUMENT = 4
ERR_INVALID_USAGE = 5
ERR_REMOTE = 6
IN_PROGRESS = 7
ERR_TIMEOUT = 8
ERR_NO_MEMORY = 9
ERR_REVOKED = 10
ERR_UNSUPPORTED = 11
ERR_MISMATCH = 12
ERR_CONNECT = 13

INT8, UINT8, INT32, UINT32, INT64, UINT64 = 0, 1, 2, 3, 4, 5
FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = 6, 7, 8, 9

SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
SPLIT_NOCOLOR = -1  # LOOM_SPLIT_NOCOLOR
GOSSIP_SEEDED = -1  # LOOM_GOSSIP_SEEDED
_OPS = {"sum": SUM, "prod": PROD, "product": PROD, "max": MAX, "min": MIN, "avg": AVG,
        "mean": AVG}

REVISION_NONE = (1 << 64) - 1

_ELEM = {INT8: 1, UINT8: 1, INT32: 4, UINT32: 4, INT64: 8, UINT64: 8, FLOAT16: 2,
         FLOAT32: 4, FLOAT64: 8, BFLOAT16: 2}
_NUMPY_TYPES = {"int8": INT8, "uint8": UINT8, "int32": INT32, "uint32": UINT32,
                "int64": INT64, "uint64": UINT64, "float16": FLOAT16, "float32": FLOAT32,
                "float64": FLOAT64}
_TORCH_TYPES = {"torch.int8": INT8, "torch.uint8": UINT8, "torch.int32": INT32,
                "torch.int64": INT64, "torch.float16": FLOAT16, "torch.float32": FLOAT32,
                "torch.float64": FLOAT64, "torch.bfloat16": BFLOAT16}


# ------------------------------------------------------------------- errors
class Error(Exception):
    """A Loom call failed.

    ``result`` is the ``loom_result_t`` (an int, one of the ``loom.ERR_*``
    constants), ``name`` its C name and ``message`` the library's detailed
    message (``loom_get_last_error``), which names the argument, peer or
    address involved.
    """

    def __init__(self, result, message=""):
        self.result = int(result)
        self.name = _RESULT_NAMES.get(self.result, "loom_result_t %d" % self.result)
        self.message = message or strerror(self.result)
        super().__init__(self.result, self.message)

    def __str__(self):
        return "%s (%s)" % (self.message, self.name)


class SystemCallError(Error):
    """LOOM_ERR_SYSTEM: a system call failed."""


class InternalError(Error):
    """LOOM_ERR_INTERNAL: a bug in Loom."""


class InvalidArgument(Error, ValueError):
    """LOOM_ERR_INVALID_ARGUMENT: a bad argument; nothing was touched.

    Also raised by the package itself for a buffer Loom cannot take (not
    contiguous, not on the CPU, a type Loom has no datatype for, sizes that
    do not match)."""


class InvalidUsage(Error):
    """LOOM_ERR_INVALID_USAGE: a call out of order or on a wrong object."""


class RemoteError(Error):
    """LOOM_ERR_REMOTE: a peer failed, closed or sent garbage."""


class TimeoutError(Error, builtins.TimeoutError):
    """LOOM_ERR_TIMEOUT: a deadline passed."""

    def __str__(self):
        return Error.__str__(self)


class NoMemoryError(Error, MemoryError):
    """LOOM_ERR_NO_MEMORY: an allocation failed."""


class RevokedError(Error):
    """LOOM_ERR_REVOKED: the communicator was revoked or aborted."""


class UnsupportedError(Error):
    """LOOM_ERR_UNSUPPORTED: not available in this build or here."""


class MismatchError(Error):
    """LOOM_ERR_MISMATCH: peers disagree (job, size, version, settings,
    or the collective calls they make)."""


class ConnectError(Error):
    """LOOM_ERR_CONNECT: could not reach an address."""


_RESULT_NAMES = {0: "LOOM_SUCCESS", 2: "LOOM_ERR_SYSTEM", 3: "LOOM_ERR_INTERNAL",
                 4: "LOOM_ERR_INVALID_ARGUMENT", 5: "LOOM_ERR_INVALID_USAGE",
                 6: "LOOM_ERR_REMOTE", 7: "LOOM_IN_PROGRESS", 8: "LOOM_ERR_TIMEOUT",
                 9: "LOOM_ERR_NO_MEMORY", 10: "LOOM_ERR_REVOKED", 11: "LOOM_ERR_UNSUPPORTED",
                 12: "LOOM_ERR_MISMATCH", 13: "LOOM_ERR_CONNECT"}
_ERRORS = {2: SystemCallError, 3: InternalError, 4: InvalidArgument, 5: InvalidUsage,
           6: RemoteError, 8: TimeoutError, 9: NoMemoryError, 10: RevokedError,
           11: UnsupportedError, 12: MismatchError, 13: ConnectError}


def strerror(result):
    """The static text of a result code (``loom_strerror``)."""
    return lib.loom_strerror(int(result)).decode()


def _raise(rc):
    msg = lib.loom_get_last_error()
    e = _ERRORS.get(rc, Error)(rc, msg.decode(errors="replace") if msg else "")
    cause, _codec_failure[0] = _codec_failure[0], None
    if cause is not None:
        e.message += " [the codec's Python method raised %s: %s]" % (type(cause).__name__,
                                                                      cause)
        raise e from cause
    raise e


def _check(rc):
    if rc:
        _raise(rc)


def _bad(msg):
    return InvalidArgument(ERR_INVALID_ARGUMENT, msg)


def version():
    """The library's version as a tuple (major, minor, patch)."""
    a, b, c = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _check(lib.loom_get_version(byref(a), byref(b), byref(c)))
    return (a.value, b.value, c.value)


# ------------------------------------------------------------------ buffers
class _Buf:
    """A contiguous CPU buffer: its address, element count and datatype."""
    __slots__ = ("obj", "ptr", "count", "dtype", "nbytes")

    def __init__(self, obj, ptr, count, dtype):
        self.obj = obj
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.nbytes = count * _ELEM[dtype]

    def end(self):
        return self.ptr + self.nbytes


def _buf(obj, what, writable=False):
    """Describe obj (a NumPy array or a torch CPU tensor) without copying."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        if obj.device.type != "cpu":
            raise _bad("%s: a tensor on %s; Loom takes CPU tensors" % (what, obj.device))
        dt = _TORCH_TYPES.get(str(obj.dtype))
        if dt is None:
            raise _bad("%s: torch dtype %s has no Loom datatype" % (what, obj.dtype))
        if not obj.is_contiguous():
            raise _bad("%s: the tensor is not contiguous (Loom works on the tensor's own "
                       "memory; pass t.contiguous() and copy the result back)" % what)
        n = obj.numel()
        return _Buf(obj, obj.data_ptr() if n else 0, n, dt)
    if mod == "numpy":
        if not obj.flags.c_contiguous:
            raise _bad("%s: the array is not C-contiguous (Loom works on the array's own "
                       "memory; pass numpy.ascontiguousarray(a) and copy the result back)"
                       % what)
        if writable and not obj.flags.writeable:
            raise _bad("%s: the array is read-only and Loom writes into it" % what)
        dt = _NUMPY_TYPES.get(obj.dtype.name)
        if dt is None or not obj.dtype.isnative:
            raise _bad("%s: NumPy dtype %s has no Loom datatype" % (what, obj.dtype))
        n = obj.size
        return _Buf(obj, obj.ctypes.data if n else 0, n, dt)
    raise _bad("%s: a %s.%s, not a NumPy array or a torch CPU tensor"
               % (what, mod, type(obj).__name__))


def _same_type(a, b, fn):
    if a.dtype != b.dtype:
        raise _bad("%s: the send and receive buffers have different types" % fn)


def _empty(like, count, shape):
    """A new buffer of count elements of like's type, shaped shape if it fits."""
    mod = type(like.obj).__module__
    if mod.startswith("torch"):
        t = like.obj.new_empty(count)
        return t.view(shape) if shape is not None else t
    import numpy
    a = numpy.empty(count, dtype=like.obj.dtype)
    return a.reshape(shape) if shape is not None else a


def _op(op):
    if isinstance(op, str):
        v = _OPS.get(op.lower())
        if v is None:
            raise _bad("unknown op %r (sum, prod, max, min or avg)" % op)
        return v
    if op in (SUM, PROD, MAX, MIN, AVG):
        return int(op)
    raise _bad("unknown op %r (sum, prod, max, min or avg)" % (op,))


# ------------------------------------------------------------------- codecs
_codec_cache = {}


class Codec:
    """A codec instance (``loom_codec_find``): ``Codec("int8")``,
    ``Codec("topk:0.01")``.  Usable as ``codec=`` and to encode and decode
    float32 buffers by hand."""

    def __init__(self, spec):
        spec = str(spec)
        p = _codec_cache.get(spec)
        if p is None:
            ptr = ctypes.c_void_p()
            _check(lib.loom_codec_find(spec.encode(), byref(ptr)))
            p = _codec_cache.setdefault(spec, ptr.value)
        self.spec = spec
        self._ptr = p

    def __repr__(self):
        return "loom.Codec(%r)" % self.spec

    def max_encoded_bytes(self, count):
        """The largest encoding of count values, in bytes."""
        n = ctypes.c_size_t()
        _check(lib.loom_codec_max_encoded_bytes(self._ptr, count, byref(n)))
        return n.value

    def encode(self, src, decoded=None):
        """Encode a float32 buffer; returns a NumPy uint8 array of the
        encoding.  decoded, if given, receives the decoded encoding."""
        import numpy
        s = _buf(src, "src")
        if s.dtype != FLOAT32:
            raise _bad("Codec.encode: src must be float32")
        out = numpy.empty(self.max_encoded_bytes(s.count), dtype=numpy.uint8)
        d = _buf(decoded, "decoded", True).ptr if decoded is not None else None
        if decoded is not None and _buf(decoded, "decoded").count != s.count:
            raise _bad("Codec.encode: decoded has another size than src")
        n = ctypes.c_size_t()
        _check(lib.loom_codec_encode(self._ptr, s.ptr, s.count, out.ctypes.data, out.size,
                                     byref(n), d))
        return out[:n.value]

    def decode(self, data, out, accumulate=False):
        """out[:] = the values encoded in data (a uint8 array or bytes), or
        out += them with accumulate=True; returns out."""
        import numpy
        enc = numpy.frombuffer(data, dtype=numpy.uint8) if isinstance(data, (bytes, bytearray)) \
            else data
        e = _buf(enc, "data")
        o = _buf(out, "out", True)
        if o.dtype != FLOAT32:
            raise _bad("Codec.decode: out must be float32")
        f = lib.loom_codec_decode_accumulate if accumulate else lib.loom_codec_decode
        _check(f(self._ptr, e.ptr, e.nbytes, o.ptr, o.count))
        return out

    def encode_ef(self, state, key, src, *, tensor_count=None, offset=0, decoded=None):
        """Encode src (float32) plus the error-feedback residual of its
        elements [offset, offset + len(src)) of tensor key, of tensor_count
        elements in all (default: len(src), the whole tensor), kept in
        state (a :class:`CodecState`); what was not sent becomes their
        pending residual, for state.commit(key) or state.rollback(key)
        (``loom_codec_encode_ef``).  Returns a NumPy uint8 array of the
        encoding; decoded, if given, receives the decoded encoding."""
        import numpy
        if not isinstance(state, CodecState):
            raise _bad("Codec.encode_ef: state is a %s, not a loom.CodecState"
                       % type(state).__name__)
        h = state._live("Codec.encode_ef")
        s = _buf(src, "src")
        if s.dtype != FLOAT32:
            raise _bad("Codec.encode_ef: src must be float32")
        offset = int(offset)
        if tensor_count is None:
            if offset:
                raise _bad("Codec.encode_ef: tensor_count is needed with an offset (%d)"
                           % offset)
            tensor_count = s.count
        tensor_count = int(tensor_count)
        if offset < 0 or tensor_count < 0:
            raise _bad("Codec.encode_ef: offset %d and tensor_count %d must not be negative"
                       % (offset, tensor_count))
        if offset + s.count > tensor_count:
            raise _bad("Codec.encode_ef: offset %d + %d elements of src exceed tensor_count %d"
                       % (offset, s.count, tensor_count))
        d = None
        if decoded is not None:
            db = _buf(decoded, "decoded", True)
            if db.dtype != FLOAT32 or db.count != s.count:
                raise _bad("Codec.encode_ef: decoded must be float32 of src's %d elements"
                           % s.count)
            d = db.ptr
        out = numpy.empty(self.max_encoded_bytes(s.count), dtype=numpy.uint8)
        n = ctypes.c_size_t()
        _check(lib.loom_codec_encode_ef(self._ptr, h, int(key), tensor_count, offset, s.ptr,
                                        s.count, out.ctypes.data, out.size, byref(n), d))
        return out[:n.value]

    def reduce_encoded(self, dst, src):
        """dst = the encoding of the sum of dst and src, two encodings of
        the same count of equal length, without decoding (additive codecs
        only: "bf16", "fp16"; ``loom_codec_reduce_encoded``).  dst is a
        writable uint8 array, src one too or bytes; returns dst."""
        import numpy
        enc = numpy.frombuffer(src, dtype=numpy.uint8) if isinstance(src, (bytes, bytearray)) \
            else src
        s = _buf(enc, "src")
        d = _buf(dst, "dst", True)
        for name, b in (("dst", d), ("src", s)):
            if b.dtype not in (UINT8, INT8):
                raise _bad("Codec.reduce_encoded: %s must be an encoding (uint8), not of "
                           "Loom datatype %d" % (name, b.dtype))
        if s.nbytes != d.nbytes:
            raise _bad("Codec.reduce_encoded: dst has %d bytes, src %d (both must encode the "
                       "same count)" % (d.nbytes, s.nbytes))
        _check(lib.loom_codec_reduce_encoded(self._ptr, d.ptr, s.ptr, d.nbytes))
        return dst


def _codec_ptr(codec):
    if codec is None:
        return None
    if isinstance(codec, Codec):
        return codec._ptr
    return Codec(codec)._ptr


# -------------------------------------------------------- codecs of Python
CODEC_ADDITIVE = 0x1
CODEC_DECODE_REDUCE = 0x2
CODEC_GATHER_ONLY = 0x4
_CODEC_KINDS = {"additive": CODEC_ADDITIVE, "decode_reduce": CODEC_DECODE_REDUCE,
                "gather_only": CODEC_GATHER_ONLY}
CODEC_NAME_MAX = 32

# What lives as long as the process, as the registrations do: the tables'
# callbacks (ctypes frees a callback's trampoline with its object) and
# the Python objects that codec instances stand for, by the number that
# Loom keeps in their params.
_codec_tables = []
_codec_objects = {}
_codec_lock = threading.Lock()
_codec_failure = [None]


def _codec_keep(obj):
    with _codec_lock:
        k = len(_codec_objects) + 1
        _codec_objects[k] = obj
    return k


def _np_view(ptr, count, ctype, npname, writable):
    """A NumPy array over count ctype values at ptr (valid while the
    callback runs)."""
    import numpy
    if not count:
        return numpy.empty(0, dtype=npname)
    a = numpy.frombuffer((ctype * count).from_address(ptr), dtype=npname)
    if not writable:
        a.flags.writeable = False
    return a


def _callback(default_rc, field="params"):
    """Wrap a codec callback: the codec's Python object is found through
    the params of the instance Loom passes (configure: through user, the
    object registered); an exception becomes a result code (that of a
    loom.Error, else default_rc), and is kept for the next loom.Error
    raised (as its __cause__)."""
    def wrap(fn):
        def cb(codec, *args):
            _tls.in_callback = getattr(_tls, "in_callback", 0) + 1
            try:
                t = ctypes.cast(codec, ctypes.POINTER(_lib.CodecTable)).contents
                obj = _codec_objects[getattr(t, field)]
                return fn(obj, *args)
            except BaseException as e:  # noqa: BLE001 - never into C
                _codec_failure[0] = e
                if isinstance(e, Error) and e.result:
                    return e.result
                return default_rc
            finally:
                _tls.in_callback -= 1
        return cb
    return wrap


@_callback(ERR_INVALID_ARGUMENT, "user")
def _cb_configure(obj, args, params):
    a = args.decode() if args is not None else None
    inst = obj.configure(a)
    if inst is None:
        raise _bad("configure(%r) of codec %r returned None" % (a, obj.name))
    params[0] = _codec_keep(inst)
    return SUCCESS


@_callback(0)
def _cb_max_encoded_bytes(obj, count):
    n = int(obj.max_encoded_bytes(count))
    return n if n > 0 else 0


@_callback(ERR_INTERNAL)
def _cb_encode(obj, src, count, dst, capacity, length):
    n = obj.encode(_np_view(src, count, ctypes.c_float, "float32", False),
                   _np_view(dst, capacity, ctypes.c_uint8, "uint8", True))
    n = int(n)
    if n < 0 or n > capacity:
        raise InternalError(ERR_INTERNAL, "codec encode returned %d bytes, capacity %d"
                            % (n, capacity))
    length[0] = n
    return SUCCESS


@_callback(ERR_REMOTE)
def _cb_decode(obj, src, length, dst, count):
    obj.decode(_np_view(src, length, ctypes.c_uint8, "uint8", False),
               _np_view(dst, count, ctypes.c_float, "float32", True))
    return SUCCESS


@_callback(ERR_REMOTE)
def _cb_decode_accumulate(obj, src, length, acc, count):
    obj.decode_accumulate(_np_view(src, length, ctypes.c_uint8, "uint8", False),
                          _np_view(acc, count, ctypes.c_float, "float32", True))
    return SUCCESS


@_callback(ERR_REMOTE)
def _cb_reduce_encoded(obj, dst, src, length):
    obj.reduce_encoded(_np_view(dst, length, ctypes.c_uint8, "uint8", True),
                       _np_view(src, length, ctypes.c_uint8, "uint8", False))
    return SUCCESS


def register_codec(codec):
    """Add a codec written in Python (``loom_codec_register``), for the
    life of the process; find its instances with ``loom.Codec(spec)``.

    codec is an object with ``name`` (1 to 31 of a-z, 0-9, _ and -; new),
    ``kind`` ("additive", "decode_reduce", "gather_only" or a
    ``loom.CODEC_*`` constant) and the methods, called with NumPy arrays
    over Loom's buffers (valid during the call only):

    * ``max_encoded_bytes(count)``: the largest encoding, in bytes;
    * ``encode(src, dst)``: encode src (float32, read-only) into dst
      (uint8, capacity bytes); return the bytes written;
    * ``decode(src, dst)`` and/or ``decode_accumulate(src, acc)``: dst[:] =
      / acc += the values encoded in src (uint8, read-only); one may be
      missing;
    * ``reduce_encoded(dst, src)``: additive codecs only: dst = the
      encoding of the sum of dst and src;
    * ``configure(args)`` (optional): for a spec "name:args" (args None
      for a bare "name"), return the object whose methods the instance
      calls (self, or a new one holding the parameters).

    An exception in a method becomes its result code: a loom.Error's own,
    else LOOM_ERR_INVALID_ARGUMENT (configure), LOOM_ERR_INTERNAL
    (encode), LOOM_ERR_REMOTE (the decoders and reduce_encoded: their
    input came from the network) or 0 bytes (max_encoded_bytes); the
    exception becomes the ``__cause__`` of the loom.Error raised next.
    The methods may be called from Loom's threads (with the GIL), at the
    same time on disjoint buffers.
    """
    name = getattr(codec, "name", None)
    if not isinstance(name, str) or not name:
        raise _bad("register_codec: codec.name must be a non-empty str, not %r" % (name,))
    if len(name) >= CODEC_NAME_MAX:
        raise _bad("register_codec: codec.name %r is longer than %d characters"
                   % (name, CODEC_NAME_MAX - 1))
    kind = getattr(codec, "kind", None)
    props = _CODEC_KINDS.get(kind.lower()) if isinstance(kind, str) else kind
    if props not in (CODEC_ADDITIVE, CODEC_DECODE_REDUCE, CODEC_GATHER_ONLY):
        raise _bad("register_codec: codec.kind %r is not one of additive, decode_reduce, "
                   "gather_only" % (kind,))
    for m in ("max_encoded_bytes", "encode"):
        if not callable(getattr(codec, m, None)):
            raise _bad("register_codec: codec %r has no method %s" % (name, m))
    if not (callable(getattr(codec, "decode", None))
            or callable(getattr(codec, "decode_accumulate", None))):
        raise _bad("register_codec: codec %r has neither decode nor decode_accumulate" % name)
    L = _lib
    t = L.CodecTable()
    t.size = ctypes.sizeof(L.CodecTable)
    t.name = name.encode()
    t.props = props
    t.user = t.params = _codec_keep(codec)
    t.max_encoded_bytes = L.CODEC_MAX_ENCODED_BYTES(_cb_max_encoded_bytes)
    t.encode = L.CODEC_ENCODE(_cb_encode)
    if callable(getattr(codec, "configure", None)):
        t.configure = L.CODEC_CONFIGURE(_cb_configure)
    if callable(getattr(codec, "decode", None)):
        t.decode = L.CODEC_DECODE(_cb_decode)
    if callable(getattr(codec, "decode_accumulate", None)):
        t.decode_accumulate = L.CODEC_DECODE(_cb_decode_accumulate)
    if callable(getattr(codec, "reduce_encoded", None)):
        t.reduce_encoded = L.CODEC_REDUCE_ENCODED(_cb_reduce_encoded)
    _check(lib.loom_codec_register(byref(t)))
    _codec_tables.append(t)  # the table holds its callbacks


class CodecState:
    """Error-feedback residuals of many tensors (``loom_codec_state_t``),
    each named by an integer key; pass it as ``state=`` with ``key=`` to a
    collective with a codec."""

    def __init__(self):
        h = ctypes.c_void_p()
        _check(lib.loom_codec_state_create(byref(h)))
        self._h = h.value

    def close(self):
        """Free the residuals."""
        if self._h:
            h, self._h = self._h, None
            _check(lib.loom_codec_state_destroy(h))

    def _live(self, fn):
        if not self._h:
            raise InvalidUsage(ERR_INVALID_USAGE, "%s: the CodecState was closed" % fn)
        return self._h

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def commit(self, key):
        _check(lib.loom_codec_state_commit(self._live("CodecState.commit"), key))

    def rollback(self, key):
        _check(lib.loom_codec_state_rollback(self._live("CodecState.rollback"), key))

    def reset(self, key):
        """Forget tensor key (its residual restarts from zero)."""
        _check(lib.loom_codec_state_reset(self._live("CodecState.reset"), key))

    def residual(self, key, out):
        """Copy the committed residual of tensor key into out (float32)."""
        o = _buf(out, "out", True)
        _check(lib.loom_codec_state_residual(self._live("CodecState.residual"), key, o.ptr,
                                             o.count))
        return out


def _opts(codec, state, key):
    if codec is None and state is None:
        return None
    if state is not None and not isinstance(state, CodecState):
        raise _bad("state is a %s, not a loom.CodecState" % type(state).__name__)
    o = _lib.CollOptions(ctypes.sizeof(_lib.CollOptions), _codec_ptr(codec),
                         state._live("state") if state is not None else None, int(key))
    return o


# ----------------------------------------------------------------- requests
class Request:
    """A non-blocking operation.  ``wait()`` completes it and returns its
    result buffer (or None); ``test()`` returns True once it completed.
    The buffers it was given are kept alive until it completes; they must
    not be touched meanwhile."""
    __slots__ = ("_comm", "_h", "_keep", "_result", "_error", "done")

    def __init__(self, comm, handle, keep, result):
        self._comm = comm
        self._h = handle
        self._keep = keep
        self._result = result
        self._error = None
        self.done = False

    def _finish(self, error):
        """Completed (by Loom, or failed with `error`): drop the buffers."""
        self.done = True
        self._keep = None
        self._error = error

    def _end(self, rc):
        err = None
        if rc:
            try:
                _raise(rc)
            except Error as e:
                err = e
        self._finish(err)
        if err is not None:
            raise err

    def wait(self):
        """Block (without the GIL) until the operation completes; raise its
        error (again, on a later call), or return its result buffer."""
        if self.done:
            if self._error is not None:
                raise self._error
            return self._result
        with self._comm._lock:
            rc = lib.loom_wait(byref(self._h))
        self._end(rc)
        return self._result

    def test(self):
        """Make progress without blocking; True when the operation has
        completed (its error is raised then, and by wait())."""
        if self.done:
            if self._error is not None:
                raise self._error
            return True
        d = ctypes.c_int()
        with self._comm._lock:
            rc = lib.loom_test(byref(self._h), byref(d))
        if d.value or rc:
            self._end(rc)
        return bool(d.value)

    def is_completed(self):
        return self.done


def _requests(requests, fn):
    """The list of requests, checked, and the array of their handles
    (LOOM_REQUEST_NULL for those complete already)."""
    reqs = list(requests)
    seen = {}
    for i, r in enumerate(reqs):
        if not isinstance(r, Request):
            raise _bad("%s: requests[%d] is a %s, not a loom.Request"
                       % (fn, i, type(r).__name__))
        if id(r) in seen:
            raise _bad("%s: requests[%d] is requests[%d] again" % (fn, i, seen[id(r)]))
        seen[id(r)] = i
    arr = (ctypes.c_void_p * max(len(reqs), 1))()
    for i, r in enumerate(reqs):
        arr[i] = None if r.done else r._h.value
    return reqs, arr


@contextlib.contextmanager
def _locks(reqs):
    """The locks of the requests' communicators, in one order."""
    comms = sorted({id(r._comm): r._comm for r in reqs if not r.done}.items())
    with contextlib.ExitStack() as st:
        for _, c in comms:
            st.enter_context(c._lock)
        yield


def wait_all(requests):
    """Wait for every request (``loom_wait_all``: one call, without the
    GIL); raise the first failure, in the order they completed.  Loom
    reports only that one: after a failure every request of the list
    that was pending raises it too from wait().  Requests complete
    already are skipped (their own failure is raised when no new one
    happened)."""
    reqs, arr = _requests(requests, "wait_all")
    pending = [r for r in reqs if not r.done]
    if pending:
        with _locks(pending):
            rc = lib.loom_wait_all(arr, len(reqs))
        err = None
        if rc:
            try:
                _raise(rc)
            except Error as e:
                err = e
        if err is not None and any(arr[i] for i in range(len(reqs))):
            raise err  # refused: nothing was waited for
        for r in pending:
            r._h.value = None
            r._finish(err)
        if err is not None:
            raise err
    for r in reqs:
        if r._error is not None:
            raise r._error


def wait_any(requests):
    """Wait until one of the requests completes (``loom_wait_any``,
    without the GIL) and return its index in the list; None when every
    request is complete already (they are skipped), so that a loop of
    ``while (i := loom.wait_any(reqs)) is not None`` sees each request
    once.  When the operation failed its error is raised (and by the
    request's wait()), with the index in ``.index``."""
    reqs, arr = _requests(requests, "wait_any")
    if all(r.done for r in reqs):
        return None
    idx = ctypes.c_int(-1)
    with _locks(reqs):
        rc = lib.loom_wait_any(arr, len(reqs), byref(idx))
    i = idx.value
    if i < 0:
        _check(rc)  # refused: nothing waited for
        return None
    r = reqs[i]
    r._h.value = None
    try:
        r._end(rc)
    except Error as e:
        e.index = i
        raise
    return i


_tls = threading.local()


@contextlib.contextmanager
def group():
    """``with loom.group():`` queues the blocking collectives, sends and
    receives of this thread and runs them together at the end of the
    block (``loom_group_start`` / ``loom_group_end``), so sends and
    receives never deadlock whatever their order."""
    _check(lib.loom_group_start())
    keep = getattr(_tls, "keep", None)
    if keep is None:
        keep = _tls.keep = []
    _tls.depth = getattr(_tls, "depth", 0) + 1
    ok = False
    try:
        yield
        ok = True
    finally:
        _tls.depth -= 1
        rc = lib.loom_group_end()
        if _tls.depth == 0:
            keep.clear()
        if ok:
            _check(rc)


def _in_group():
    return getattr(_tls, "depth", 0) > 0


# ------------------------------------------------------------ communicators
def get_unique_id():
    """Create a job identity (128 bytes) and start its rendezvous service
    in this process (``loom_get_unique_id``); pass it to every rank."""
    u = _lib.UniqueIdStruct()
    _check(lib.loom_get_unique_id(byref(u)))
    return ctypes.string_at(ctypes.addressof(u), _lib.UNIQUE_ID_BYTES)


# ------------------------------------------------------------------ memory
_LOOM_TO_NUMPY = {v: k for k, v in _NUMPY_TYPES.items()}
_LOOM_TO_TORCH = {v: k for k, v in _TORCH_TYPES.items()}


def _datatype(dtype, what):
    """The Loom datatype of a NumPy or torch dtype, a name ("float32",
    "bfloat16") or a loom.* datatype constant."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in _ELEM:
            return dtype
    elif isinstance(dtype, str):
        n = dtype[6:] if dtype.startswith("torch.") else dtype
        if n == "bfloat16":
            return BFLOAT16
        if n in _NUMPY_TYPES:
            return _NUMPY_TYPES[n]
    elif type(dtype).__module__.startswith("torch"):
        if str(dtype) in _TORCH_TYPES:
            return _TORCH_TYPES[str(dtype)]
    else:
        try:
            import numpy
            d = numpy.dtype(dtype)
        except (TypeError, ValueError, ImportError):
            d = None
        if d is not None and d.isnative and d.name in _NUMPY_TYPES:
            return _NUMPY_TYPES[d.name]
    raise _bad("%s: dtype %r has no Loom datatype" % (what, dtype))


def _shape(count_or_shape, what):
    if isinstance(count_or_shape, int) and not isinstance(count_or_shape, bool):
        shape = (count_or_shape,)
    else:
        try:
            if isinstance(count_or_shape, (str, bytes)):
                raise TypeError
            shape = tuple(int(d) for d in count_or_shape)
        except (TypeError, ValueError):
            raise _bad("%s: %r is neither a count nor a shape" % (what, count_or_shape)) \
                from None
    n = 1
    for d in shape:
        if d < 0:
            raise _bad("%s: shape %r has a negative dimension" % (what, shape))
        n *= d
    if n == 0:
        raise _bad("%s: shape %r holds no element (a window has at least one)" % (what, shape))
    return shape, n


def _defer_free(comm, fn, ptr):
    """A finaliser's release (fn None: only the check of _bury): now if
    the communicator is free, else at its next call (never from inside a
    codec callback, where Loom is busy on this thread, nor waiting for
    another thread's call)."""
    if getattr(_tls, "in_callback", 0) or not comm._lock.acquire(blocking=False):
        if fn is not None:
            comm._orphans.append((fn, ptr))
        return
    try:
        if comm._h and fn is not None:
            fn(comm._h, ptr)
        comm._bury()
    finally:
        comm._lock.release()


def _view_died(wself, ref):
    """A view's base is gone (a weakref callback)."""
    w = wself()
    if w is None:
        return
    w._views.discard(ref)
    c = w._comm
    if not w._views and w._state is None and c._zombie:
        # abort() left the communicator to this window's views.
        w._gone("freed with its communicator (abort)")
        c._windows.discard(w)
        _defer_free(c, None, None)


class Window:
    """Memory of :meth:`Communicator.mem_alloc` (``loom_mem_alloc``): a
    window that the ranks of a host map too, so that an allreduce whose
    buffers lie in it (at the same offsets on every rank) reads the
    peers' memory instead of staging it (see loom_mem_alloc(3)).

    :meth:`numpy` and :meth:`torch` give views of the whole window, of
    the shape and dtype it was allocated with; slice them for buffers.
    Every view keeps the window alive (through its base object), so the
    memory is never unmapped under one: :meth:`free` raises
    :class:`InvalidUsage` while a view is alive, and a window that nobody
    references any more, view or Window, is freed by its finaliser.
    :meth:`Communicator.close` refuses while a window has views, and
    frees the others (their Window objects then refuse to make views)."""

    def __init__(self, comm, ptr, shape, count, dtype):
        self._comm = comm
        self._ptr = ptr
        self.shape = shape
        self.count = count
        self.dtype = dtype
        self.nbytes = count * _ELEM[dtype]
        self._views = set()  # weak references to the views' bases
        self._state = None  # None while live, else why it is not
        self._bytes = type("WindowBytes", (ctypes.c_uint8 * self.nbytes,),
                           {"__hash__": object.__hash__})

    def __repr__(self):
        return "<loom.Window of %d bytes at 0x%x, %s%s>" % (
            self.nbytes, self._ptr or 0, self.shape, "" if self._state is None
            else " (%s)" % self._state)

    @property
    def ptr(self):
        """The window's address."""
        return self._ptr

    def live_views(self):
        """How many base objects of views (:meth:`numpy`, :meth:`torch`)
        are alive; a view's own views share its base."""
        return len(self._views)

    def _busy(self):
        if self._views:
            gc.collect()  # views held only by garbage cycles
        return len(self._views)

    def _view(self, fn):
        with self._comm._lock:
            if self._state is not None:
                raise InvalidUsage(ERR_INVALID_USAGE, "Window.%s: the window was %s"
                                   % (fn, self._state))
            b = self._bytes.from_address(self._ptr)
            b.window = self  # the view's base keeps the window
            self._views.add(weakref.ref(b, functools.partial(_view_died, weakref.ref(self))))
            return b

    def numpy(self):
        """A NumPy array over the window (shape and dtype as allocated)."""
        np_name = _LOOM_TO_NUMPY.get(self.dtype)
        if np_name is None:
            raise _bad("Window.numpy: NumPy has no bfloat16; use Window.torch()")
        import numpy
        return numpy.frombuffer(self._view("numpy"), dtype=np_name).reshape(self.shape)

    def torch(self):
        """A torch CPU tensor over the window (shape and dtype as
        allocated; the dtype's torch equivalent)."""
        t_name = _LOOM_TO_TORCH.get(self.dtype)
        if t_name is None:
            raise _bad("Window.torch: torch has no dtype for Loom datatype %d" % self.dtype)
        import torch
        return torch.frombuffer(self._view("torch"), dtype=getattr(torch, t_name[6:])) \
            .view(self.shape)

    def free(self):
        """Free the window (``loom_mem_free``; local).  Raises
        :class:`InvalidUsage` while a view is alive, when the window was
        freed already or went with its communicator, and (from Loom)
        while an operation on it is not waited for."""
        self._free("free", True)

    def close(self):
        """As :meth:`free`, but a window freed already is no error."""
        self._free("close", False)

    def _free(self, fn, strict):
        c = self._comm
        with c._lock:
            if self._state is not None:
                if strict:
                    raise InvalidUsage(ERR_INVALID_USAGE, "Window.%s: the window was %s"
                                       % (fn, self._state))
                return
            n = self._busy()
            if n:
                raise InvalidUsage(ERR_INVALID_USAGE,
                                   "Window.%s: %d view(s) of the window are alive (NumPy "
                                   "arrays or torch tensors, or views of them); delete them "
                                   "first" % (fn, n))
            if c._h:
                _check(lib.loom_mem_free(c._h, self._ptr))
            self._state = "freed"
            c._windows.discard(self)
            c._bury()

    def _gone(self, why):
        self._state = why

    def __del__(self):
        # Runs once no view is left (each holds the window).
        try:
            if self._state is None:
                self._state = "freed"
                self._comm._windows.discard(self)
                _defer_free(self._comm, lib.loom_mem_free, self._ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Registration:
    """A buffer registered with :meth:`Communicator.mem_register`
    (``loom_mem_register``) until :meth:`deregister`, the end of a
    ``with`` block, its finaliser or the communicator's close.  It keeps
    the buffer alive meanwhile; do not resize a registered tensor."""

    def __init__(self, comm, handle, buf):
        self._comm = comm
        self._hreg = handle
        self.buffer = buf.obj
        self.ptr = buf.ptr
        self.nbytes = buf.nbytes
        self._state = None

    def __repr__(self):
        return "<loom.Registration of %d bytes at 0x%x%s>" % (
            self.nbytes, self.ptr, "" if self._state is None else " (%s)" % self._state)

    @property
    def registered(self):
        return self._state is None

    def deregister(self):
        """Drop the registration (``loom_mem_deregister``).  Raises
        :class:`InvalidUsage` when it was dropped already (or went with
        the communicator's close)."""
        self._drop("deregister", True)

    def close(self):
        """As :meth:`deregister`, but one dropped already is no error."""
        self._drop("close", False)

    def _drop(self, fn, strict):
        c = self._comm
        with c._lock:
            if self._state is not None:
                if strict:
                    raise InvalidUsage(ERR_INVALID_USAGE, "Registration.%s: the registration "
                                       "was %s" % (fn, self._state))
                return
            if c._h:
                _check(lib.loom_mem_deregister(c._h, self._hreg))
            self._state = "deregistered"
            self.buffer = None
            c._regs.discard(self)

    def _gone(self, why):
        self._state = why
        self.buffer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._state is None:
                self._state = "deregistered"
                self._comm._regs.discard(self)
                _defer_free(self._comm, lib.loom_mem_deregister, self._hreg)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _config(timeout=None, tcp_streams=None, chunk_bytes=None, socket_ifname=None, algo=None,
            transport=None):
    c = _lib.Config()
    _check(lib.loom_config_init(byref(c)))
    if timeout is not None:
        ms = int(round(float(timeout) * 1000))
        if ms < 1:
            raise _bad("timeout %r: at least 0.001 s" % (timeout,))
        c.timeout_ms = min(ms, 86400000)
    if tcp_streams is not None:
        c.tcp_streams = int(tcp_streams)
    if chunk_bytes is not None:
        c.chunk_bytes = int(chunk_bytes)
    if socket_ifname is not None:
        c.socket_ifname = socket_ifname.encode()
    if algo is not None:
        c.algo = algo.encode()
    if transport is not None:
        c.transport = transport.encode()
    return c


class Communicator:
    """A Loom communicator.

    Create one with :meth:`from_env` (under loomrun, torchrun, Slurm or
    mpirun), :meth:`from_unique_id`, :meth:`from_store` (a torch
    ``Store`` or anything with ``set(key, bytes)`` and ``get(key)``) or
    :meth:`join`.  Keyword settings (``timeout`` in seconds,
    ``tcp_streams``, ``chunk_bytes``, ``socket_ifname``, ``algo``,
    ``transport``) fill ``loom_config_t``; those not given come from the
    ``LOOM_*`` environment variables.

    Buffers are NumPy arrays or torch CPU tensors, used in place
    (contiguous; :class:`InvalidArgument` otherwise).  Every method
    releases the GIL while Loom runs.  One thread at a time uses a
    communicator: a lock per communicator makes other threads wait.
    """

    def __init__(self, handle):
        self._h = handle
        self._lock = threading.RLock()
        self._windows = weakref.WeakSet()  # of mem_alloc, live
        self._regs = weakref.WeakSet()     # of mem_register, live
        self._orphans = []                 # (fn, ptr) finalisers left to call
        self._zombie = None                # aborted, waiting for views to go
        self._zombie_keep = None
        r, s = ctypes.c_int(), ctypes.c_int()
        _check(lib.loom_comm_rank(handle, byref(r)))
        _check(lib.loom_comm_size(handle, byref(s)))
        self.rank = r.value
        self.size = s.value

    # -- creation
    @classmethod
    def from_env(cls, **settings):
        """Join the job the launcher's environment describes
        (``loom_comm_init_env``)."""
        c = _config(**settings)
        h = ctypes.c_void_p()
        _check(lib.loom_comm_init_env(byref(h), byref(c)))
        return cls(h)

    @classmethod
    def from_unique_id(cls, unique_id, rank, size, **settings):
        """Join the job named by unique_id (from :func:`get_unique_id`) as
        rank of size (``loom_comm_init_rank``)."""
        b = bytes(unique_id)
        if len(b) != _lib.UNIQUE_ID_BYTES:
            raise _bad("unique_id: %d bytes, not %d" % (len(b), _lib.UNIQUE_ID_BYTES))
        u = _lib.UniqueIdStruct()
        ctypes.memmove(byref(u), b, len(b))
        c = _config(**settings)
        h = ctypes.c_void_p()
        _check(lib.loom_comm_init_rank(byref(h), int(size), byref(u), int(rank), byref(c)))
        return cls(h)

    @classmethod
    def from_store(cls, store, rank, size, prefix="loom", **settings):
        """Rank 0 makes a unique id and publishes it in store under
        ``prefix + "/unique_id"``; the others read it (torch's
        ``Store.get`` waits for it), then all join."""
        key = prefix + "/unique_id"
        if int(rank) == 0:
            uid = get_unique_id()
            store.set(key, uid)
        else:
            uid = bytes(store.get(key))
        return cls.from_unique_id(uid, rank, size, **settings)

    @classmethod
    def join(cls, root=None, key=None, **settings):
        """Enter a running job as a new rank (``loom_comm_join``): waits
        until the members call :meth:`grow`.  root ("host:port") and key
        default to ``LOOM_ROOT`` and ``LOOM_JOB_KEY``; given, they are put
        into the environment first."""
        if root is not None:
            os.environ["LOOM_ROOT"] = str(root)
        if key is not None:
            os.environ["LOOM_JOB_KEY"] = str(key)
        c = _config(**settings)
        h = ctypes.c_void_p()
        _check(lib.loom_comm_join(byref(h), byref(c)))
        return cls(h)

    def __repr__(self):
        return "<loom.Communicator rank %d of %d%s>" % (self.rank, self.size,
                                                       "" if self._h else " (closed)")

    # -- lifetime
    def close(self):
        """Release the communicator (``loom_comm_destroy``; not collective).
        Non-blocking operations must be complete.  Raises
        :class:`InvalidUsage`, and changes nothing, while a window of
        :meth:`mem_alloc` has views alive (Loom would unmap it under
        them); its other windows and registrations go with it."""
        with self._lock:
            if self._h:
                busy = [w for w in list(self._windows) if w._busy()]
                if busy:
                    raise InvalidUsage(
                        ERR_INVALID_USAGE,
                        "close: %d window(s) of mem_alloc still have NumPy arrays or torch "
                        "tensors viewing them (%s); delete those first, or abort()"
                        % (len(busy), ", ".join("%d bytes at 0x%x" % (w.nbytes, w.ptr)
                                                for w in busy)))
                _check(lib.loom_comm_destroy(self._h))
                self._h = None
                self._orphans.clear()
                self._release_all("freed with its communicator")

    destroy = close

    def abort(self):
        """Drop every operation now and release the communicator
        (``loom_comm_abort``); peers see their operations fail.  While a
        window of :meth:`mem_alloc` has views alive, the communicator is
        revoked now (``loom_comm_revoke``: every rank's operations fail)
        and aborted once the last such view is gone, so its memory stays
        mapped until then; it is closed for every call at once."""
        with self._lock:
            if not self._h:
                return
            h, self._h = self._h, None
            self._orphans.clear()
            busy = [w for w in list(self._windows) if w._busy()]
            if not busy:
                self._release_all("freed with its communicator (abort)")
                _check(lib.loom_comm_abort(h))
                return
            lib.loom_comm_revoke(h)
            self._zombie = h
            self._zombie_keep = [r.buffer for r in list(self._regs)]
            for w in list(self._windows):
                if not w._views:
                    w._gone("freed with its communicator (abort)")
                    self._windows.discard(w)
            self._release_all(None)

    def _release_all(self, why):
        """Mark the windows (those with views too unless why is None) and
        the registrations left as gone with the communicator."""
        if why is not None:
            for w in list(self._windows):
                w._gone(why)
            self._windows = weakref.WeakSet()
        for r in list(self._regs):
            r._gone("released with its communicator")
        self._regs = weakref.WeakSet()

    def _bury(self):
        """Abort the communicator that abort() left to its windows' views,
        once they are all gone."""
        if self._zombie and not any(w._state is None for w in list(self._windows)):
            h, self._zombie, self._zombie_keep = self._zombie, None, None
            lib.loom_comm_abort(h)

    def _reap(self):
        """Call the frees that finalisers left (with the lock held)."""
        while self._orphans:
            fn, p = self._orphans.pop()
            if self._h:
                fn(self._h, p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Windows and registrations hold the communicator: none is left.
        h = getattr(self, "_h", None)
        if h and lib is not None:
            try:
                if lib.loom_comm_destroy(h):
                    lib.loom_comm_abort(h)
            except Exception:
                pass
        z = getattr(self, "_zombie", None)
        if z and lib is not None:
            try:
                lib.loom_comm_abort(z)
            except Exception:
                pass

    def _handle(self):
        h = self._h
        if not h:
            raise InvalidUsage(ERR_INVALID_USAGE, "the communicator was closed")
        return h

    # -- settings
    def set_algo(self, spec):
        """Force algorithms (``loom_comm_set_algo``); None: automatic."""
        with self._lock:
            _check(lib.loom_comm_set_algo(self._handle(), spec.encode() if spec else None))

    def set_codec(self, codec):
        """The codec plain float32 sum/avg allreduces use (None: exact)."""
        with self._lock:
            _check(lib.loom_comm_set_codec(self._handle(), _codec_ptr(codec)))

    def get_error(self):
        """(result, failed_rank): the first error that broke the
        communicator (0 while healthy) and the rank found responsible
        (-1 when none is known)."""
        r = ctypes.c_int(-1)
        with self._lock:
            rc = lib.loom_comm_get_error(self._handle(), byref(r))
        return rc, r.value

    # -- the calls
    def _run(self, fn, args, nonblocking, keep, result):
        """Call fn(*args) (+ a request pointer when nonblocking)."""
        h = self._handle()
        if nonblocking:
            if _in_group():
                raise InvalidUsage(ERR_INVALID_USAGE,
                                   "non-blocking calls are not allowed in a loom.group()")
            req = ctypes.c_void_p()
            with self._lock:
                self._reap()
                rc = fn(*args, h, byref(req))
            if rc:
                _raise(rc)
            return Request(self, req, keep, result)
        if _in_group():
            _tls.keep.append(keep)
        with self._lock:
            self._reap()
            rc = fn(*args, h)
        if rc:
            _raise(rc)
        return result

    def _run_opts(self, fn_opts, args, opts, nonblocking, keep, result):
        h = self._handle()
        if nonblocking:
            if _in_group():
                raise InvalidUsage(ERR_INVALID_USAGE,
                                   "non-blocking calls are not allowed in a loom.group()")
            req = ctypes.c_void_p()
            with self._lock:
                self._reap()
                rc = fn_opts(*args, h, byref(opts) if opts is not None else None, byref(req))
            if rc:
                _raise(rc)
            return Request(self, req, (keep, opts), result)
        if _in_group():
            _tls.keep.append((keep, opts))
        with self._lock:
            self._reap()
            rc = fn_opts(*args, h, byref(opts) if opts is not None else None)
        if rc:
            _raise(rc)
        return result

    def _allreduce(self, x, op, out, codec, state, key, nb):
        s = _buf(x, "sendbuf", out is None)
        if out is None or out is x:
            r = s
        else:
            r = _buf(out, "out", True)
            _same_type(s, r, "allreduce")
            if r.count != s.count:
                raise _bad("allreduce: out has %d elements, the input %d" % (r.count, s.count))
        opts = _opts(codec, state, key)
        res = r.obj
        if opts is None:
            f = lib.loom_iallreduce if nb else lib.loom_allreduce
            return self._run(f, (s.ptr, r.ptr, s.count, s.dtype, _op(op)), nb, (s, r), res)
        f = lib.loom_iallreduce_opts if nb else lib.loom_allreduce_opts
        return self._run_opts(f, (s.ptr, r.ptr, s.count, s.dtype, _op(op)), opts, nb, (s, r),
                              res)

    def allreduce(self, x, op=SUM, *, out=None, codec=None, state=None, key=0):
        """out = op over all ranks of x (in place when out is None);
        returns the result.  codec (a spec such as "int8" or a
        :class:`Codec`) encodes the traffic (float32 sum/avg only); state
        and key add error feedback (:class:`CodecState`)."""
        return self._allreduce(x, op, out, codec, state, key, False)

    def iallreduce(self, x, op=SUM, *, out=None, codec=None, state=None, key=0):
        """Non-blocking :meth:`allreduce`: returns a :class:`Request`."""
        return self._allreduce(x, op, out, codec, state, key, True)

    def _reduce_scatter(self, x, op, out, codec, state, key, nb):
        s = _buf(x, "sendbuf")
        if out is None:
            if s.count % self.size:
                raise _bad("reduce_scatter: %d elements do not split into %d blocks"
                           % (s.count, self.size))
            shape = None
            sh = tuple(x.shape)
            if sh and sh[0] % self.size == 0:
                shape = (sh[0] // self.size,) + sh[1:]
            out = _empty(s, s.count // self.size, shape)
        r = _buf(out, "out", True)
        _same_type(s, r, "reduce_scatter")
        if s.count != r.count * self.size:
            raise _bad("reduce_scatter: the input has %d elements, not %d x out's %d"
                       % (s.count, self.size, r.count))
        opts = _opts(codec, state, key)
        args = (s.ptr, r.ptr, r.count, s.dtype, _op(op))
        if opts is None:
            f = lib.loom_ireduce_scatter if nb else lib.loom_reduce_scatter
            return self._run(f, args, nb, (s, r), out)
        f = lib.loom_ireduce_scatter_opts if nb else lib.loom_reduce_scatter_opts
        return self._run_opts(f, args, opts, nb, (s, r), out)

    def reduce_scatter(self, x, op=SUM, *, out=None, codec=None, state=None, key=0):
        """out = block ``rank`` of op over all ranks of x (size blocks of
        out's length); out None: a new buffer.  In place: out is the view
        of block ``rank`` of x.  codec/state/key as :meth:`allreduce`."""
        return self._reduce_scatter(x, op, out, codec, state, key, False)

    def ireduce_scatter(self, x, op=SUM, *, out=None, codec=None, state=None, key=0):
        """Non-blocking :meth:`reduce_scatter`."""
        return self._reduce_scatter(x, op, out, codec, state, key, True)

    def _allgather(self, x, out, codec, state, key, nb):
        s = _buf(x, "sendbuf")
        if out is None:
            out = _empty(s, s.count * self.size, (self.size,) + tuple(x.shape))
        r = _buf(out, "out", True)
        _same_type(s, r, "allgather")
        if r.count != s.count * self.size:
            raise _bad("allgather: out has %d elements, not %d x the input's %d"
                       % (r.count, self.size, s.count))
        opts = _opts(codec, state, key)
        if opts is None:
            f = lib.loom_iallgather if nb else lib.loom_allgather
            return self._run(f, (s.ptr, r.ptr, s.count, s.dtype), nb, (s, r), out)
        f = lib.loom_iallgather_opts if nb else lib.loom_allgather_opts
        return self._run_opts(f, (s.ptr, r.ptr, s.count, s.dtype), opts, nb, (s, r), out)

    def allgather(self, x, *, out=None, codec=None, state=None, key=0):
        """Block r of out = rank r's x; out None: a new buffer of shape
        (size,) + x.shape.  In place: x is the view of block ``rank`` of
        out.  codec/state/key as :meth:`allreduce`."""
        return self._allgather(x, out, codec, state, key, False)

    def iallgather(self, x, *, out=None, codec=None, state=None, key=0):
        """Non-blocking :meth:`allgather`."""
        return self._allgather(x, out, codec, state, key, True)

    def _alltoall(self, x, out, nb):
        s = _buf(x, "sendbuf", out is None)
        r = s if out is None else _buf(out, "out", True)
        _same_type(s, r, "alltoall")
        if s.count != r.count or s.count % self.size:
            raise _bad("alltoall: the buffers must be equal and split into %d blocks "
                       "(%d and %d elements)" % (self.size, s.count, r.count))
        f = lib.loom_ialltoall if nb else lib.loom_alltoall
        return self._run(f, (s.ptr, r.ptr, s.count // self.size, s.dtype), nb, (s, r), r.obj)

    def alltoall(self, x, *, out=None):
        """Block r of out = block ``rank`` of rank r's x (size equal
        blocks); in place when out is None."""
        return self._alltoall(x, out, False)

    def ialltoall(self, x, *, out=None):
        """Non-blocking :meth:`alltoall`."""
        return self._alltoall(x, out, True)

    def _alltoallv(self, x, sendcounts, sdispls, out, recvcounts, rdispls, nb):
        s = _buf(x, "sendbuf")
        r = _buf(out, "out", True)
        _same_type(s, r, "alltoallv")
        arr = ctypes.c_size_t * self.size
        vs = []
        for name, v in (("sendcounts", sendcounts), ("sdispls", sdispls),
                        ("recvcounts", recvcounts), ("rdispls", rdispls)):
            v = [int(i) for i in v]
            if len(v) != self.size:
                raise _bad("alltoallv: %s has %d entries, not %d" % (name, len(v), self.size))
            if min(v) < 0:
                raise _bad("alltoallv: %s has a negative entry" % name)
            vs.append(arr(*v))
        for c, d, b, name in ((vs[0], vs[1], s, "sendbuf"), (vs[2], vs[3], r, "out")):
            if any(c[i] + d[i] > b.count for i in range(self.size)):
                raise _bad("alltoallv: a block lies beyond the end of %s (%d elements)"
                           % (name, b.count))
        f = lib.loom_ialltoallv if nb else lib.loom_alltoallv
        return self._run(f, (s.ptr, vs[0], vs[1], r.ptr, vs[2], vs[3], s.dtype), nb,
                         (s, r, vs), out)

    def alltoallv(self, x, sendcounts, sdispls, out, recvcounts, rdispls):
        """MPI_Alltoallv: sendcounts[r] elements of x from sdispls[r] go to
        rank r, which receives them into out at its rdispls[rank]."""
        return self._alltoallv(x, sendcounts, sdispls, out, recvcounts, rdispls, False)

    def ialltoallv(self, x, sendcounts, sdispls, out, recvcounts, rdispls):
        """Non-blocking :meth:`alltoallv`."""
        return self._alltoallv(x, sendcounts, sdispls, out, recvcounts, rdispls, True)

    def _broadcast(self, x, root, out, nb):
        s = _buf(x, "sendbuf", out is None)
        r = s if out is None else _buf(out, "out", True)
        _same_type(s, r, "broadcast")
        if s.count != r.count:
            raise _bad("broadcast: out has %d elements, the input %d" % (r.count, s.count))
        f = lib.loom_ibroadcast if nb else lib.loom_broadcast
        return self._run(f, (s.ptr, r.ptr, s.count, s.dtype, int(root)), nb, (s, r), r.obj)

    def broadcast(self, x, root=0, *, out=None):
        """out on every rank = x of root (in place: x, when out is None)."""
        return self._broadcast(x, root, out, False)

    def ibroadcast(self, x, root=0, *, out=None):
        """Non-blocking :meth:`broadcast`."""
        return self._broadcast(x, root, out, True)

    def _reduce(self, x, op, root, out, nb):
        s = _buf(x, "sendbuf", out is None and self.rank == root)
        r = s if out is None else _buf(out, "out", True)
        _same_type(s, r, "reduce")
        if s.count != r.count:
            raise _bad("reduce: out has %d elements, the input %d" % (r.count, s.count))
        f = lib.loom_ireduce if nb else lib.loom_reduce
        res = r.obj if self.rank == root else None
        return self._run(f, (s.ptr, r.ptr, s.count, s.dtype, _op(op), int(root)), nb, (s, r),
                         res)

    def reduce(self, x, op=SUM, root=0, *, out=None):
        """out on root = op over all ranks of x (in place when out is
        None); returns it on root, None elsewhere."""
        return self._reduce(x, op, root, out, False)

    def ireduce(self, x, op=SUM, root=0, *, out=None):
        """Non-blocking :meth:`reduce`."""
        return self._reduce(x, op, root, out, True)

    def _gather(self, x, root, out, nb):
        s = _buf(x, "sendbuf")
        is_root = self.rank == int(root)
        if is_root:
            if out is None:
                out = _empty(s, s.count * self.size, (self.size,) + tuple(x.shape))
            r = _buf(out, "out", True)
            _same_type(s, r, "gather")
            if r.count != s.count * self.size:
                raise _bad("gather: out has %d elements, not %d x the input's %d"
                           % (r.count, self.size, s.count))
            rp = r.ptr
        else:
            r, rp, out = None, None, None
        f = lib.loom_igather if nb else lib.loom_gather
        return self._run(f, (s.ptr, rp, s.count, s.dtype, int(root)), nb, (s, r), out)

    def gather(self, x, root=0, *, out=None):
        """Block r of out on root = rank r's x; out None on root: a new
        buffer of shape (size,) + x.shape.  Returns it on root, None
        elsewhere."""
        return self._gather(x, root, out, False)

    def igather(self, x, root=0, *, out=None):
        """Non-blocking :meth:`gather`."""
        return self._gather(x, root, out, True)

    def _scatter(self, x, out, root, nb):
        r = _buf(out, "out", True)
        if self.rank == int(root):
            s = _buf(x, "sendbuf")
            _same_type(s, r, "scatter")
            if s.count != r.count * self.size:
                raise _bad("scatter: the input has %d elements, not %d x out's %d"
                           % (s.count, self.size, r.count))
            sp = s.ptr
        else:
            s, sp = None, None
        f = lib.loom_iscatter if nb else lib.loom_scatter
        return self._run(f, (sp, r.ptr, r.count, r.dtype, int(root)), nb, (s, r), out)

    def scatter(self, x, out, root=0):
        """out of rank r = block r of root's x (read on root only; x may be
        None elsewhere); returns out."""
        return self._scatter(x, out, root, False)

    def iscatter(self, x, out, root=0):
        """Non-blocking :meth:`scatter`."""
        return self._scatter(x, out, root, True)

    def barrier(self):
        """Return once every rank has entered the barrier."""
        return self._run(lib.loom_barrier, (), False, None, None)

    def ibarrier(self):
        """Non-blocking :meth:`barrier`."""
        return self._run(lib.loom_ibarrier, (), True, None, None)

    def _gossip(self, x, peer, round, nb):
        b = _buf(x, "buf", True)
        f = lib.loom_igossip_average if nb else lib.loom_gossip_average
        return self._run(f, (b.ptr, b.count, b.dtype, int(peer), int(round)), nb, b, b.obj)

    def gossip_average(self, x, peer=GOSSIP_SEEDED, round=0):
        """x = (x of the lower rank + x of the higher) / 2 with one
        partner, in place (floating types only); returns x.  peer: the
        partner, who names this rank back (this rank itself: sit out), or
        GOSSIP_SEEDED: the partner of round ``round`` of the seeded pairing
        (loom_gossip_average(3))."""
        return self._gossip(x, peer, round, False)

    def igossip_average(self, x, peer=GOSSIP_SEEDED, round=0):
        """Non-blocking :meth:`gossip_average`."""
        return self._gossip(x, peer, round, True)

    def gossip_partner(self, round):
        """This rank's partner in round ``round`` of the seeded pairing
        (this rank itself when it sits the round out)."""
        p = ctypes.c_int(-1)
        with self._lock:
            rc = lib.loom_gossip_partner(self._handle(), int(round), byref(p))
        if rc:
            _raise(rc)
        return p.value

    def send(self, x, peer):
        """Send x to rank peer (matched in order with its :meth:`recv`)."""
        b = _buf(x, "buf")
        return self._run(lib.loom_send, (b.ptr, b.count, b.dtype, int(peer)), False, b, None)

    def recv(self, x, peer):
        """Receive into x from rank peer; returns x."""
        b = _buf(x, "buf", True)
        return self._run(lib.loom_recv, (b.ptr, b.count, b.dtype, int(peer)), False, b, x)

    def isend(self, x, peer):
        """Non-blocking :meth:`send`."""
        b = _buf(x, "buf")
        return self._run(lib.loom_isend, (b.ptr, b.count, b.dtype, int(peer)), True, b, None)

    def irecv(self, x, peer):
        """Non-blocking :meth:`recv`."""
        b = _buf(x, "buf", True)
        return self._run(lib.loom_irecv, (b.ptr, b.count, b.dtype, int(peer)), True, b, x)

    # -- memory
    def mem_alloc(self, count_or_shape, dtype="float32"):
        """Collective: a :class:`Window` of count elements (or of a shape)
        of dtype (a NumPy or torch dtype, or its name) on every rank
        (``loom_mem_alloc``): every rank allocates the same, in the same
        order.  Its :meth:`Window.numpy` / :meth:`Window.torch` views are
        buffers that a large allreduce on one host reads in place."""
        shape, n = _shape(count_or_shape, "mem_alloc")
        dt = _datatype(dtype, "mem_alloc")
        if _in_group():
            raise InvalidUsage(ERR_INVALID_USAGE, "mem_alloc is not allowed in a loom.group()")
        p = ctypes.c_void_p()
        with self._lock:
            h = self._handle()
            self._reap()
            _check(lib.loom_mem_alloc(h, n * _ELEM[dt], byref(p)))
            w = Window(self, p.value, shape, n, dt)
            self._windows.add(w)
        return w

    def mem_register(self, buf):
        """Register buf (a NumPy array or torch CPU tensor) with the
        transports that need registered memory (``loom_mem_register``;
        elsewhere it is only recorded).  Returns a :class:`Registration`,
        a context manager, which keeps buf alive until deregistered."""
        b = _buf(buf, "buf")
        if not b.nbytes:
            raise _bad("mem_register: buf is empty (0 bytes)")
        hreg = ctypes.c_void_p()
        with self._lock:
            h = self._handle()
            self._reap()
            _check(lib.loom_mem_register(h, b.ptr, b.nbytes, byref(hreg)))
            r = Registration(self, hreg.value, b)
            self._regs.add(r)
        return r

    # -- membership
    def revoke(self):
        """Make every rank's pending and later operations on this
        communicator fail with :class:`RevokedError`."""
        with self._lock:
            _check(lib.loom_comm_revoke(self._handle()))

    def get_failed(self):
        """The ranks known here to have failed, ascending."""
        n = ctypes.c_int()
        with self._lock:
            h = self._handle()
            _check(lib.loom_comm_get_failed(h, None, 0, byref(n)))
            while True:
                cap = max(n.value, 1)
                arr = (ctypes.c_int * cap)()
                _check(lib.loom_comm_get_failed(h, arr, cap, byref(n)))
                if n.value <= cap:
                    return list(arr[:n.value])

    def shrink(self):
        """Collective over the survivors: a new communicator of the ranks
        not failed (this one is revoked and must still be closed).  Raises
        RevokedError in a group of survivors without a quorum
        (LOOM_QUORUM) and on a rank the others declared failed."""
        nh = ctypes.c_void_p()
        with self._lock:
            _check(lib.loom_comm_shrink(self._handle(), byref(nh)))
        return Communicator(nh)

    def split(self, color, key=None, **settings):
        """Collective over every rank (``loom_comm_split``): the ranks
        passing the same color (an int >= 0) form a new communicator,
        ranked by key (default: this rank), then by rank.  color None or
        SPLIT_NOCOLOR: this rank joins none and gets None.  Keyword
        settings (as for :meth:`from_env`) override this communicator's;
        the new one outlives it and fails on its own."""
        col = SPLIT_NOCOLOR if color is None else int(color)
        k = self.rank if key is None else int(key)
        c = _config(**settings) if settings else None
        nh = ctypes.c_void_p()
        with self._lock:
            _check(lib.loom_comm_split(self._handle(), col, k, byref(c) if c is not None else None,
                                       byref(nh)))
        return Communicator(nh) if nh.value else None

    def create_group(self, ranks, tag=0):
        """Collective over the listed ranks only
        (``loom_comm_create_group``, as ``MPI_Comm_create_group``): they
        form a new communicator whose rank i is ``ranks[i]`` of this one;
        the other ranks do not call it.  Every listed rank passes the same
        list and tag (an int >= 0); a member with another list or tag, or
        one that never calls, is named in the error every member gets.  No
        new rendezvous: the new communicator is connected over this one's
        control plane, and outlives it and fails on its own."""
        lst = [int(r) for r in ranks]
        arr = (ctypes.c_int * max(len(lst), 1))(*lst)
        nh = ctypes.c_void_p()
        with self._lock:
            _check(lib.loom_comm_create_group(self._handle(), len(lst), arr, int(tag), byref(nh)))
        return Communicator(nh)

    def agree(self, value, op=MIN):
        """Fault-tolerant agreement on an unsigned 64-bit value: the
        minimum (op MIN; of flags: AND) or maximum (MAX: OR) of the
        contributions, the same on every rank that returns."""
        v = ctypes.c_uint64(int(value))
        with self._lock:
            _check(lib.loom_comm_agree(self._handle(), byref(v), _op(op)))
        return v.value

    def pending_joins(self):
        """How many processes wait to join (no communication)."""
        n = ctypes.c_int()
        with self._lock:
            _check(lib.loom_comm_pending_joins(self._handle(), byref(n)))
        return n.value

    def grow(self):
        """Collective over the members: admit the processes waiting to join
        (and leave out failed ranks).  Returns the new communicator, or
        None when nothing changed (this one goes on); otherwise close this
        one."""
        nh = ctypes.c_void_p()
        with self._lock:
            _check(lib.loom_comm_grow(self._handle(), byref(nh)))
        return Communicator(nh) if nh.value else None

    def state_sync(self, tensors, revision=0):
        """Collective: make every rank hold the same list of tensors (the
        newest revision wins; see loom_state_sync(3)).  Returns the
        winning revision."""
        bufs = [_buf(t, "tensors[%d]" % i, True) for i, t in enumerate(tensors)]
        arr = (_lib.Tensor * max(len(bufs), 1))()
        for i, b in enumerate(bufs):
            arr[i].data = b.ptr
            arr[i].bytes = b.nbytes
        rev = ctypes.c_uint64(int(revision))
        with self._lock:
            _check(lib.loom_state_sync(self._handle(), arr, len(bufs), byref(rev)))
        return rev.value
