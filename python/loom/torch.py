"""torch.distributed backend "loom" (see loom-python(7)).

``import loom.torch`` registers it::

    import torch.distributed as dist
    import loom.torch
    dist.init_process_group("loom")      # under torchrun or loomrun (env://)

Each process group (the default one and every ``dist.new_group``) is a
Loom communicator.  The default group's is created through the c10d
store torch hands the backend: rank 0 of the group makes a unique id and
puts it in the store, the others read it.  A ``dist.new_group`` (whose
creator torch calls on its members only) is made from the default
group's communicator with ``Communicator.create_group``
(``loom_comm_create_group``): the members write their ranks in the
default group to the group's store and read the others', then connect
over the default communicator's control plane, with no new rendezvous.
:data:`stats` counts both kinds.  Operations run in the order they are issued, on a
thread of the group's own, in Loom's non-blocking calls; a work's
``wait()`` and ``get_future()`` follow them.  ``import loom.torch`` also
sets ``LOOM_PROGRESS_THREAD=1`` unless the environment says otherwise,
so that operations advance while the program computes.

The timeout torch gives the group becomes the communicator's
``timeout_ms`` unless ``LOOM_TIMEOUT`` is set.  Failures of peers are
found by Loom's heartbeats whatever the timeout: the pending and later
operations of the group then fail, and ``wait()`` raises.

:func:`compress_hook` makes a DDP communication hook that allreduces
gradient buckets through a Loom codec.
"""
import atexit
import collections
import os
import threading
import weakref
from datetime import timedelta

os.environ.setdefault("LOOM_PROGRESS_THREAD", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from . import _core  # noqa: E402
from ._core import AVG, MAX, MIN, PROD, SUM  # noqa: E402

__all__ = ["LoomProcessGroup", "compress_hook", "communicator", "stats", "BACKEND"]

BACKEND = "loom"

try:
    from torch._C._distributed_c10d import ProcessGroup as _PG
    from torch._C._distributed_c10d import Work as _Work
except ImportError:  # pragma: no cover - other layouts of torch
    _PG = dist.ProcessGroup
    _Work = dist.distributed_c10d.Work

_RO = dist.ReduceOp


def _code(op):
    """The number of a ReduceOp, a RedOpType or an int."""
    op = getattr(op, "op", op)
    return int(getattr(op, "value", op))


_REDOPS = {_code(_RO.SUM): SUM, _code(_RO.PRODUCT): PROD, _code(_RO.MIN): MIN,
           _code(_RO.MAX): MAX}
if hasattr(_RO, "AVG"):
    _REDOPS[_code(_RO.AVG)] = AVG


def _redop(op):
    """A torch ReduceOp as Loom's op."""
    try:
        v = _REDOPS.get(_code(op))
    except (TypeError, ValueError):
        v = None
    if v is None:
        raise ValueError("loom backend: reduce op %s is not supported (SUM, PRODUCT, MIN, MAX%s)"
                         % (op, ", AVG" if hasattr(_RO, "AVG") else ""))
    return v


class _Failed:
    """The value of a failed operation's inner future (see _Op)."""
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


def _unwrap(f):
    v = f.value()
    if isinstance(v, _Failed):
        raise v.exc
    return v


class _Op:
    """One operation of a group: start() gives a loom.Request (or None when
    it is done at once), finish() the future's value once it completed.

    The future handed out (fut) follows an inner one (done) through
    then(): a failure raised in the callback marks fut failed in C++,
    where DDP's reducer looks.  (torch 1.13's Future.set_exception stores
    the exception as the value, which C++ takes for tensors.)"""
    __slots__ = ("start", "finish", "done", "fut", "req", "p2p")

    def __init__(self, start, finish, p2p=False):
        self.start = start
        self.finish = finish
        self.p2p = p2p
        self.done = torch.futures.Future()
        self.fut = self.done.then(_unwrap)
        self.req = None

    def fail(self, exc):
        self.done.set_result(_Failed(exc))


class _Driver(threading.Thread):
    """Starts a group's operations in issue order and completes their
    futures.  It alone calls Loom on the group's communicator.

    While a send or a receive is in flight it polls the requests (Loom's
    progress thread or its loom_test calls move them on), backing off up
    to a millisecond while none completes, so that operations issued
    later are started at once (a receive can wait on a send the program
    issues after it).  While only collectives are in flight it blocks in
    loom_wait_any over them, without the GIL, after a few tests: every
    rank starts a group's collectives in one order, so the ones in
    flight complete without the ones queued behind them, and Loom's own
    wait moves them on with no gap (polls a millisecond apart left the
    transfers of a large allreduce waiting between polls).  What was
    queued meanwhile starts as soon as one completes."""

    def __init__(self, comm):
        super().__init__(name="loom-torch", daemon=True)
        self.comm = comm
        self.cv = threading.Condition()
        self.queue = collections.deque()
        self.closing = False
        self.start()

    def submit(self, op):
        with self.cv:
            if self.closing:
                raise RuntimeError("loom backend: the process group was destroyed")
            self.queue.append(op)
            self.cv.notify()
        return op.fut

    def close(self):
        with self.cv:
            self.closing = True
            self.cv.notify()
        if threading.current_thread() is not self:
            self.join(60)

    SPINS = 20

    def run(self):
        inflight = []
        delay, spins = 0.0, 0
        while True:
            with self.cv:
                if not self.queue:
                    if self.closing and not inflight:
                        return
                    if not inflight:
                        self.cv.wait()
                    elif delay:
                        self.cv.wait(delay)
                new = list(self.queue)
                self.queue.clear()
            progressed = False
            for op in new:
                progressed = True
                try:
                    op.req = op.start()
                except BaseException as e:  # noqa: BLE001
                    op.fail(e)
                    continue
                if op.req is None:
                    self._complete(op)
                else:
                    inflight.append(op)
            still = []
            for op in inflight:
                try:
                    done = op.req.test()
                except BaseException as e:  # noqa: BLE001
                    op.fail(e)
                    progressed = True
                    continue
                if done:
                    progressed = True
                    self._complete(op)
                else:
                    still.append(op)
            inflight = still
            # Small operations end within microseconds: test again at once
            # a few times (the GIL is free during each test), then block
            # or sleep longer and longer.
            if progressed:
                delay, spins = 0.0, 0
            elif spins < self.SPINS:
                spins += 1
            elif inflight and not any(op.p2p for op in inflight):
                with self.cv:
                    if self.queue:
                        continue
                inflight = self._wait_one(inflight)
                delay, spins = 0.0, 0
            else:
                delay = min(max(2 * delay, 2e-5), 1e-3)

    def _wait_one(self, inflight):
        """Block until one of the collectives in flight completes; complete
        it and return the others."""
        try:
            i = _core.wait_any([op.req for op in inflight])
        except _core.Error as e:
            i = getattr(e, "index", None)
            if i is None:  # refused: each is tested again
                return inflight
            inflight[i].fail(e)
        else:
            if i is None:  # complete already: tested again
                return inflight
            self._complete(inflight[i])
        return inflight[:i] + inflight[i + 1:]

    @staticmethod
    def _complete(op):
        try:
            value = op.finish()
        except BaseException as e:  # noqa: BLE001
            op.fail(e)
            return
        op.done.set_result(value)


class _LoomWork(_Work):
    """The work object of an operation: wait(), is_completed(), result(),
    exception() and get_future() (what DDP's communication hooks use).

    C++ (DDP's reducer, the parameter checks of DDP's constructor) calls
    these through torch's trampoline only while the Python object lives:
    once Python drops it, the C++ half's wait() waits forever and
    get_future() fails.  So the group keeps each work (_Keeper) until
    its operation has completed and the work was waited for, its future
    taken or its completion seen; a work nobody ever looks at is let go
    only when thousands of newer ones have come."""

    def __init__(self, fut):
        super().__init__()
        self._fut = fut
        self.seen = False

    def wait(self, timeout=None):
        try:
            self._fut.wait()
        finally:
            self.seen = True
        return True

    def is_completed(self):
        done = self._fut.done()
        if done:
            self.seen = True
        return done

    def is_success(self):
        if not self.is_completed():
            return False
        return self.exception() is None

    def exception(self):
        try:
            self._fut.value()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def result(self):
        return self._fut.wait()

    def source_rank(self):
        return -1

    def synchronize(self):
        pass

    def get_future(self):
        self.seen = True
        return self._fut


class _Keeper:
    """The works of a group that C++ may still call (see _LoomWork)."""
    CAP = 4096

    def __init__(self):
        self.works = collections.deque()

    def add(self, w):
        self.works.append(w)
        if len(self.works) >= 64 and len(self.works) % 64 == 0:
            keep = [x for x in self.works if not (x.seen and x._fut.done())]
            while len(keep) > self.CAP and keep[0]._fut.done():
                keep.pop(0)
            self.works = collections.deque(keep)


def _bv(t):
    """A contiguous tensor as Loom can move it: itself, or its bytes when
    Loom has no datatype for it (bool, complex: broadcast, gathers,
    scatters, all-to-all and point-to-point only move data)."""
    if t is None or str(t.dtype) in _core._TORCH_TYPES:
        return t
    return t.reshape(-1).view(torch.uint8)


def _esz(t):
    """Elements of t per element Loom moves (see _bv)."""
    return 1 if str(t.dtype) in _core._TORCH_TYPES else t.element_size()


def _flat(t):
    """t itself when Loom can use it, else a contiguous copy (written back
    by the caller)."""
    return t if t.is_contiguous() else t.contiguous()


def _copy_back(t, f, result):
    """The completion of a call made on f, a contiguous copy of t (or t
    itself): copy f back into t, then give result."""
    def finish():
        if f is not t:
            t.copy_(f)
        return result
    return finish


def _one(tensors, what):
    if len(tensors) != 1:
        raise ValueError("loom backend: %s takes one tensor per process, not %d"
                         % (what, len(tensors)))
    t = tensors[0]
    if t.device.type != "cpu":
        raise ValueError("loom backend: %s: a tensor on %s; the backend takes CPU tensors"
                         % (what, t.device))
    return t


_groups = weakref.WeakSet()


@atexit.register
def _shutdown_all():
    """Stop the groups' threads before the interpreter ends: a daemon
    thread that wakes up inside torch's code during finalization is ended
    there, and the process aborts ("terminate called without an active
    exception")."""
    for g in list(_groups):
        try:
            g.shutdown()
        except Exception:  # noqa: BLE001
            pass


class LoomProcessGroup(_PG):
    """A torch.distributed process group over a :class:`loom.Communicator`."""

    def __init__(self, comm, rank=None, size=None):
        super().__init__(comm.rank if rank is None else rank,
                         comm.size if size is None else size)
        self.comm = comm
        self._driver = _Driver(comm)
        self._keeper = _Keeper()
        _groups.add(self)

    # -- identity
    def getBackendName(self):
        return BACKEND

    def name(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def __repr__(self):
        return "<loom.torch.LoomProcessGroup rank %d of %d>" % (self.comm.rank, self.comm.size)

    def shutdown(self):
        """Stop the group's thread and release its communicator."""
        d = self._driver
        if d is not None:
            self._driver = None
            d.close()
            try:
                self.comm.close()
            except _core.Error:
                self.comm.abort()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001
            pass

    # -- plumbing
    def _submit(self, start, finish, p2p=False):
        if self._driver is None:
            raise RuntimeError("loom backend: the process group was shut down")
        w = _LoomWork(self._driver.submit(_Op(start, finish, p2p)))
        self._keeper.add(w)
        return w

    def _submit_fut(self, start, finish):
        return self._submit(start, finish).get_future()

    # -- collectives
    def allreduce(self, tensors, opts=None, codec=None):
        t = _one(tensors, "allreduce")
        op = _redop(opts.reduceOp if opts is not None else _RO.SUM)
        return self._allreduce(t, op, codec, tensors)

    def _allreduce(self, t, op, codec, result, state=None, key=0):
        f = _flat(t)
        comm = self.comm
        finish = _copy_back(t, f, result)
        return self._submit(lambda: comm.iallreduce(f, op, codec=codec, state=state, key=key),
                            finish)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _redop(opts.reduceOp if opts is not None else _RO.SUM)
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)
        comm = self.comm

        def finish():
            o = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[o:o + n].view_as(t))
                o += n
            return tensors
        return self._submit(lambda: comm.iallreduce(flat, op), finish)

    def broadcast(self, tensors, opts=None):
        t = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        f = _flat(t)
        comm = self.comm
        finish = _copy_back(t, f, tensors)
        return self._submit(lambda: comm.ibroadcast(_bv(f), root), finish)

    def reduce(self, tensors, opts=None):
        t = _one(tensors, "reduce")
        root = opts.rootRank if opts is not None else 0
        op = _redop(opts.reduceOp if opts is not None else _RO.SUM)
        f = _flat(t)
        comm = self.comm

        def finish():
            if f is not t and comm.rank == root:
                t.copy_(f)
            return tensors
        return self._submit(lambda: comm.ireduce(f, op, root), finish)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = _one(input_tensors, "allgather")
        outs = output_tensors[0]
        if len(outs) != self.comm.size:
            raise ValueError("loom backend: allgather needs %d output tensors, not %d"
                             % (self.comm.size, len(outs)))
        f = _flat(t)
        flat = f.new_empty(f.numel() * self.comm.size)
        comm = self.comm

        def finish():
            n = f.numel()
            for i, o in enumerate(outs):
                o.copy_(flat[i * n:(i + 1) * n].view_as(o))
            return output_tensors
        return self._submit(lambda: comm.iallgather(_bv(f), out=_bv(flat)), finish)

    def _allgather_base(self, output, input, opts=None):
        f, o = _flat(input), _flat(output)
        comm = self.comm

        def finish():
            if o is not output:
                output.copy_(o)
            return [output]
        return self._submit(lambda: comm.iallgather(_bv(f), out=_bv(o)), finish)

    allgather_into_tensor = _allgather_base

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # One allgather per tensor, in order (the result is the same).
        works = [self.allgather([outs], [t]) for outs, t in zip(output_lists, input_list)]
        return works[-1] if works else self.barrier()

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "reduce_scatter")
        ins = input_tensors[0]
        if len(ins) != self.comm.size:
            raise ValueError("loom backend: reduce_scatter needs %d input tensors, not %d"
                             % (self.comm.size, len(ins)))
        op = _redop(opts.reduceOp if opts is not None else _RO.SUM)
        flat = torch.cat([t.reshape(-1) for t in ins])
        o = _flat(out)
        comm = self.comm

        def finish():
            if o is not out:
                out.copy_(o)
            return output_tensors
        return self._submit(lambda: comm.ireduce_scatter(flat, op, out=o), finish)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _redop(opts.reduceOp if opts is not None else _RO.SUM)
        f, o = _flat(input), _flat(output)
        comm = self.comm

        def finish():
            if o is not output:
                output.copy_(o)
            return [output]
        return self._submit(lambda: comm.ireduce_scatter(f, op, out=o), finish)

    reduce_scatter_tensor = _reduce_scatter_base

    def gather(self, output_tensors, input_tensors, opts=None):
        t = _one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        f = _flat(t)
        comm = self.comm
        flat = f.new_empty(f.numel() * comm.size) if comm.rank == root else None

        def finish():
            if comm.rank == root:
                n = f.numel()
                for i, o in enumerate(output_tensors[0]):
                    o.copy_(flat[i * n:(i + 1) * n].view_as(o))
            return output_tensors
        return self._submit(lambda: comm.igather(_bv(f), root, out=_bv(flat)), finish)

    def scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        comm = self.comm
        flat = None
        if comm.rank == root:
            flat = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        o = _flat(out)

        def finish():
            if o is not out:
                out.copy_(o)
            return output_tensors
        return self._submit(lambda: comm.iscatter(_bv(flat), _bv(o), root), finish)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        comm = self.comm
        f, o = _flat(input), _flat(output)
        if not output_split_sizes and not input_split_sizes:
            def start():
                return comm.ialltoall(_bv(f), out=_bv(o))
        else:
            row_in = f[0].numel() if f.dim() > 0 and f.shape[0] else 1
            row_out = o[0].numel() if o.dim() > 0 and o.shape[0] else 1
            isz = list(input_split_sizes) or [f.shape[0] // comm.size] * comm.size
            osz = list(output_split_sizes) or [o.shape[0] // comm.size] * comm.size
            sc = [s * row_in * _esz(f) for s in isz]
            rc = [s * row_out * _esz(o) for s in osz]
            sd = [sum(sc[:i]) for i in range(comm.size)]
            rd = [sum(rc[:i]) for i in range(comm.size)]

            def start():
                return comm.ialltoallv(_bv(f), sc, sd, _bv(o), rc, rd)

        def finish():
            if o is not output:
                output.copy_(o)
            return [output]
        return self._submit(start, finish)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        comm = self.comm
        sc = [t.numel() for t in input_tensors]
        rc = [t.numel() for t in output_tensors]
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = flat_in.new_empty(sum(rc))
        sd = [sum(sc[:i]) for i in range(comm.size)]
        rd = [sum(rc[:i]) for i in range(comm.size)]
        k = _esz(flat_in)

        def finish():
            for i, t in enumerate(output_tensors):
                t.copy_(flat_out[rd[i]:rd[i] + rc[i]].view_as(t))
            return output_tensors
        return self._submit(lambda: comm.ialltoallv(
            _bv(flat_in), [c * k for c in sc], [d * k for d in sd], _bv(flat_out),
            [c * k for c in rc], [d * k for d in rd]), finish)

    def barrier(self, opts=None):
        comm = self.comm
        return self._submit(lambda: comm.ibarrier(), lambda: [])

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        return self.barrier(opts).wait()

    # -- point to point (tags are not matched: messages between two ranks
    # -- arrive in the order they were sent)
    def send(self, tensors, dstRank, tag=0):
        t = _one(tensors, "send")
        f = _flat(t)
        comm = self.comm
        return self._submit(lambda: comm.isend(_bv(f), dstRank), lambda: tensors, p2p=True)

    def recv(self, tensors, srcRank, tag=0):
        t = _one(tensors, "recv")
        f = _flat(t)
        comm = self.comm
        finish = _copy_back(t, f, tensors)
        return self._submit(lambda: comm.irecv(_bv(f), srcRank), finish, p2p=True)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("loom backend: receiving from any source is not supported")


def communicator(group=None):
    """The :class:`loom.Communicator` of a group of the "loom" backend
    (default: the default group)."""
    pg = _loom_pg(group)
    return pg.comm


def _loom_pg(group):
    if group is None or group is dist.group.WORLD:
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, LoomProcessGroup):
        return group
    # torch 2.x wraps backends: look for ours inside.
    get = getattr(group, "_get_backend", None)
    if get is not None:
        try:
            b = get(torch.device("cpu"))
            if isinstance(b, LoomProcessGroup):
                return b
        except Exception:  # noqa: BLE001
            pass
    raise ValueError("loom.torch: %r is not a process group of the loom backend" % (group,))


def compress_hook(codec="int8", error_feedback=False):
    """A DDP communication hook that averages each gradient bucket with a
    Loom allreduce through codec ("int8", "int4", "bf16", ...; see
    loom-codecs(7))::

        model.register_comm_hook(None, loom.torch.compress_hook("int8"))

    The state passed to register_comm_hook is the process group (None:
    the default group), which must be of the "loom" backend.  Buckets
    that are not float32 are averaged exactly.  With error_feedback, what
    the codec dropped from a bucket is added to it the next time (one
    residual per bucket index; a bucket that changes size starts over)."""
    spec = None if codec is None else str(codec)
    st = _core.CodecState() if error_feedback and spec else None
    sizes = {}

    def hook(state, bucket):
        pg = _loom_pg(state)
        t = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        use = spec if t.dtype == torch.float32 else None
        key = bucket.index() if hasattr(bucket, "index") else 0
        if use is not None and st is not None:
            if sizes.get(key) != t.numel():
                if key in sizes:
                    st.reset(key)
                sizes[key] = t.numel()
            work = pg._allreduce(t, AVG, use, [t], st, key)
        else:
            work = pg._allreduce(t, AVG, use, [t])
        return work.get_future().then(lambda f: f.value()[0])

    hook.__name__ = "loom_compress_hook_%s" % (spec or "none")
    hook.__qualname__ = hook.__name__
    return hook


# Communicators this process made: "rendezvous" through the store (a new
# job: unique id, bootstrap), "derived" from the default group's
# (loom_comm_create_group, no rendezvous).
stats = {"rendezvous": 0, "derived": 0}


def _default_loom_pg():
    """The default group's LoomProcessGroup, or None (no default group
    yet, as while it is being made, or one of another backend)."""
    try:
        if not dist.is_initialized():
            return None
        return _loom_pg(None)
    except (ValueError, RuntimeError):
        return None


def _create(store, rank, size, timeout, *rest):
    parent = _default_loom_pg()
    if parent is not None and parent.comm is not None:
        # A new_group: only its members get here.  Each says which rank of
        # the default group it is; the group's store is its own (torch
        # prefixes it with the group's name).
        me = parent.comm.rank
        store.set("loom/grank/%d" % rank, str(me))
        ranks = [me if r == rank else int(bytes(store.get("loom/grank/%d" % r)))
                 for r in range(size)]
        comm = parent.comm.create_group(ranks)
        stats["derived"] += 1
        return LoomProcessGroup(comm, rank, size)
    settings = {}
    if not os.environ.get("LOOM_TIMEOUT") and isinstance(timeout, timedelta):
        settings["timeout"] = max(timeout.total_seconds(), 1.0)
    comm = _core.Communicator.from_store(store, rank, size, prefix="loom", **settings)
    stats["rendezvous"] += 1
    return LoomProcessGroup(comm, rank, size)


def _register():
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    reg = dist.Backend.register_backend
    try:
        reg(BACKEND, _create, devices=["cpu"])
    except TypeError:
        reg(BACKEND, _create)


_register()
