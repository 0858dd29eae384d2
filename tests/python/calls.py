"""Every call of the loom package against NumPy references, on the ranks
of a loomrun job (tests/python/test_python.sh runs it on 1 to 4 ranks).

Each rank's input is a function of (seed, rank), so every rank computes
the reference of every call itself.  Prints "ok - ..." / "FAIL - ..."
lines and "N passed, M failed" from rank 0 (the others print failures
only), and exits non-zero on a failure.  With torch (argument --torch)
the calls run on torch CPU tensors too, bfloat16 included.
"""
import contextlib
import ctypes
import gc
import os
import sys
import threading
import time
import weakref

import numpy as np

import loom

comm = loom.Communicator.from_env()
rank, size = comm.rank, comm.size
use_torch = "--torch" in sys.argv
passed = failed = 0


def report(ok, what):
    global passed, failed
    if ok:
        passed += 1
        if rank == 0:
            print("ok   - %s" % what)
    else:
        failed += 1
        os.write(1, ("FAIL - [rank %d of %d] %s\n" % (rank, size, what)).encode())


def same(a, b, what, tol=0.0):
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        report(False, "%s: shape %s, expected %s" % (what, a.shape, b.shape))
        return
    if tol:
        ok = np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)
    else:
        ok = np.array_equal(a, b)
    report(ok, what if ok else "%s: %s, expected %s" % (what, a.ravel()[:6], b.ravel()[:6]))


def raises(exc, fn, what, contains=None):
    try:
        fn()
    except exc as e:
        ok = contains is None or contains in str(e)
        report(ok, "%s raises %s (%s)" % (what, exc.__name__, e))
        return e
    except Exception as e:  # noqa: BLE001
        report(False, "%s raised %s: %s, not %s" % (what, type(e).__name__, e, exc.__name__))
        return None
    report(False, "%s did not raise %s" % (what, exc.__name__))
    return None


INTS = ["int8", "uint8", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float16", "float32", "float64"]
OPS = ["sum", "prod", "max", "min", "avg"]


def data(r, n, dtype, op="sum", salt=0):
    """Rank r's input: small values, so no sum or product overflows."""
    g = np.random.default_rng(1000 * r + 7 * n + salt)
    if op == "prod":
        v = g.integers(1, 3, n)
    elif dtype.startswith("u"):
        v = g.integers(0, 10, n)
    else:
        v = g.integers(-10, 10, n)
    if dtype in FLOATS:
        v = v + g.integers(0, 4, n) * 0.25
    return v.astype(dtype)


def reference(op, arrays, dtype):
    a = np.stack([x.astype(np.float64) for x in arrays])
    if op == "sum":
        r = a.sum(0)
    elif op == "prod":
        r = a.prod(0)
    elif op == "max":
        r = a.max(0)
    elif op == "min":
        r = a.min(0)
    else:
        r = a.sum(0) / len(arrays)
        if dtype in INTS:
            r = np.trunc(r)
    return r.astype(dtype)


def tol(dtype):
    return {"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}.get(dtype, 0.0)


# ---------------------------------------------------------------- allreduce
for dtype in INTS + FLOATS:
    for op in OPS:
        n = 37
        x = data(rank, n, dtype, op)
        ref = reference(op, [data(r, n, dtype, op) for r in range(size)], dtype)
        out = np.empty_like(x)
        y = x.copy()
        res = comm.allreduce(x, op, out=out)
        ok = res is out and np.array_equal(x, y)
        report(ok, "allreduce %s %s out of place returns out, input untouched" % (dtype, op))
        same(out, ref, "allreduce %s %s out of place" % (dtype, op), tol(dtype))
        comm.allreduce(y, op)
        same(y, ref, "allreduce %s %s in place" % (dtype, op), tol(dtype))
x = data(rank, 1000, "float32")
ref = reference("sum", [data(r, 1000, "float32") for r in range(size)], "float32")
req = comm.iallreduce(x, loom.SUM)
spins = 0
while not req.test():
    spins += 1
same(x, ref, "iallreduce + test() loop (%d tests)" % spins, 1e-5)
report(req.wait() is x, "wait() after test() returns the buffer")
x = data(rank, 1000, "float64")
same(comm.iallreduce(x, "max").wait(), reference("max", [data(r, 1000, "float64")
                                                         for r in range(size)], "float64"),
     "iallreduce max, wait()")
z = np.empty(0, np.float32)
same(comm.allreduce(z), z, "allreduce of 0 elements")
same(comm.allreduce(np.float32(3) * np.ones((2, 3), np.float32)),
     np.full((2, 3), 3.0 * size, np.float32), "allreduce of a 2-D array")

# ------------------------------------------------------------------- codecs
n = 3360
g = [np.random.default_rng(50 + r).standard_normal(n).astype(np.float32) for r in range(size)]
exact = np.sum(g, axis=0)
for spec, rel in (("int8", 0.05), ("int4", 0.5), ("bf16", 0.02)):
    x = g[rank].copy()
    comm.allreduce(x, codec=spec)
    err = np.abs(x - exact).max() / np.abs(exact).max()
    report(err < rel, "allreduce codec=%s: max error %.4f of the largest sum (< %g)"
           % (spec, err, rel))
    allx = comm.allgather(x)
    report(all(np.array_equal(allx[r], allx[0]) for r in range(size)),
           "allreduce codec=%s leaves identical bytes on every rank" % spec)
c8 = loom.Codec("int8")
x = g[rank].copy()
y = comm.iallreduce(x, "avg", codec=c8).wait()
report(np.abs(y - exact / size).max() / np.abs(exact / size).max() < 0.05,
       "iallreduce avg with a loom.Codec object")
enc = c8.encode(g[0])
dec = c8.decode(enc, np.empty(n, np.float32))
report(len(enc) < n * 4 // 3 and np.abs(dec - g[0]).max() < 0.05 * np.abs(g[0]).max(),
       "Codec.encode/decode round trip (%d bytes for %d floats)" % (len(enc), n))
st = loom.CodecState()
x = g[rank].copy()
comm.allreduce(x, codec="int4", state=st, key=11)
if size > 1:
    resid = st.residual(11, np.empty(n, np.float32))
    report(np.abs(resid).max() > 0, "error feedback keeps a residual (state=, key=)")
st.close()
rs = comm.reduce_scatter(g[rank], codec="int8")
blk = exact.reshape(size, -1)[rank]
report(np.abs(rs - blk).max() < 0.05 * np.abs(exact).max(), "reduce_scatter codec=int8")
ag = comm.allgather(g[rank], codec="bf16")
report(all(np.abs(ag[r] - g[r]).max() < 0.01 * np.abs(g[r]).max() + 1e-6 for r in range(size)),
       "allgather codec=bf16")
raises(loom.InvalidArgument, lambda: comm.allreduce(np.ones(4, np.int32), codec="int8"),
       "a codec on int32 data", "LOOM_FLOAT32")
raises(loom.InvalidArgument, lambda: comm.allreduce(np.ones(4, np.float32), codec="nope"),
       "an unknown codec", "nope")

# ------------------------------------------------------------ reduce_scatter
for dtype in ["int32", "float32", "float64"]:
    m = 5
    x = data(rank, m * size, dtype)
    full = reference("sum", [data(r, m * size, dtype) for r in range(size)], dtype)
    blk = full[rank * m:(rank + 1) * m]
    same(comm.reduce_scatter(x), blk, "reduce_scatter %s, new buffer" % dtype, tol(dtype))
    out = np.empty(m, dtype)
    same(comm.reduce_scatter(x, out=out), blk, "reduce_scatter %s out=" % dtype, tol(dtype))
    y = x.copy()
    comm.reduce_scatter(y, out=y[rank * m:(rank + 1) * m])
    same(y[rank * m:(rank + 1) * m], blk, "reduce_scatter %s in place" % dtype, tol(dtype))
    same(comm.ireduce_scatter(x, "max").wait(),
         reference("max", [data(r, m * size, dtype) for r in range(size)], dtype)
         [rank * m:(rank + 1) * m], "ireduce_scatter %s max" % dtype)
x = data(rank, 2 * size * 3, "float32").reshape(2 * size, 3)
report(comm.reduce_scatter(x).shape == (2, 3), "reduce_scatter of (2*size, 3) gives (2, 3)")
if size > 1:
    raises(loom.InvalidArgument, lambda: comm.reduce_scatter(np.ones(size * 2 + 1, np.float32)),
           "reduce_scatter of a count not divisible by size", "blocks")
raises(loom.InvalidArgument,
       lambda: comm.reduce_scatter(np.ones(3 * size, np.float32), out=np.ones(2, np.float32)),
       "reduce_scatter with out of another size")

# ----------------------------------------------------------------- allgather
for dtype in ["uint8", "int64", "float16"]:
    x = data(rank, 6, dtype)
    ref = np.stack([data(r, 6, dtype) for r in range(size)])
    same(comm.allgather(x), ref, "allgather %s, new buffer" % dtype)
    out = np.empty(6 * size, dtype)
    same(comm.allgather(x, out=out), ref.ravel(), "allgather %s out=" % dtype)
    buf = np.zeros(6 * size, dtype)
    buf[rank * 6:(rank + 1) * 6] = x
    comm.allgather(buf[rank * 6:(rank + 1) * 6], out=buf)
    same(buf, ref.ravel(), "allgather %s in place" % dtype)
    same(comm.iallgather(x).wait(), ref, "iallgather %s" % dtype)

# ------------------------------------------------------- alltoall(v)
m = 3
x = (np.arange(m * size) + 100 * rank).astype(np.int32)
ref = np.concatenate([(np.arange(m * size) + 100 * r).astype(np.int32)[rank * m:(rank + 1) * m]
                      for r in range(size)])
same(comm.alltoall(x, out=np.empty_like(x)), ref, "alltoall out=")
y = x.copy()
same(comm.alltoall(y), ref, "alltoall in place")
same(comm.ialltoall(x, out=np.empty_like(x)).wait(), ref, "ialltoall")
# Rank s sends s + r + 1 elements to rank r, valued 1000 s + r.
sc = [rank + r + 1 for r in range(size)]
sd = list(np.cumsum([0] + sc[:-1]))
rc = [s + rank + 1 for s in range(size)]
rd = list(np.cumsum([0] + rc[:-1]))
x = np.concatenate([np.full(sc[r], 1000 * rank + r, np.float64) for r in range(size)])
out = np.empty(sum(rc), np.float64)
ref = np.concatenate([np.full(rc[s], 1000 * s + rank, np.float64) for s in range(size)])
same(comm.alltoallv(x, sc, sd, out, rc, rd), ref, "alltoallv")
out[:] = 0
same(comm.ialltoallv(x, sc, sd, out, rc, rd).wait(), ref, "ialltoallv")
raises(loom.InvalidArgument, lambda: comm.alltoallv(x, sc[:-1] + [10 ** 6], sd, out, rc, rd),
       "alltoallv with a block beyond the buffer")

# ----------------------------------------------------------- rooted calls
for root in range(size):
    x = data(rank, 9, "int64")
    ref = data(root, 9, "int64")
    y = x.copy()
    same(comm.broadcast(y, root), ref, "broadcast from %d in place" % root)
    same(comm.broadcast(x, root, out=np.empty_like(x)), ref, "broadcast from %d out=" % root)
    same(comm.ibroadcast(x.copy(), root).wait(), ref, "ibroadcast from %d" % root)
    fref = reference("sum", [data(r, 9, "float32") for r in range(size)], "float32")
    x = data(rank, 9, "float32")
    res = comm.reduce(x.copy(), "sum", root)
    if rank == root:
        same(res, fref, "reduce to %d in place" % root, 1e-5)
    else:
        report(res is None, "reduce to %d returns None on rank %d" % (root, rank))
    out = np.zeros_like(x)
    comm.reduce(x, "min", root, out=out)
    if rank == root:
        same(out, reference("min", [data(r, 9, "float32") for r in range(size)], "float32"),
             "reduce min to %d out=" % root)
    res = comm.ireduce(x.copy(), "sum", root).wait()
    if rank == root:
        same(res, fref, "ireduce to %d" % root, 1e-5)
    g1 = comm.gather(data(rank, 4, "int32"), root)
    if rank == root:
        same(g1, np.stack([data(r, 4, "int32") for r in range(size)]), "gather to %d" % root)
    else:
        report(g1 is None, "gather returns None off root")
    g2 = comm.igather(data(rank, 4, "int32"), root).wait()
    if rank == root:
        same(g2, np.stack([data(r, 4, "int32") for r in range(size)]), "igather to %d" % root)
    src = np.arange(5 * size, dtype=np.float32) * (root + 1) if rank == root else None
    out = np.empty(5, np.float32)
    same(comm.scatter(src, out, root), np.arange(5 * rank, 5 * rank + 5, dtype=np.float32)
         * (root + 1), "scatter from %d" % root)
    out[:] = 0
    same(comm.iscatter(src, out, root).wait(), np.arange(5 * rank, 5 * rank + 5,
                                                         dtype=np.float32) * (root + 1),
         "iscatter from %d" % root)

comm.barrier()
comm.ibarrier().wait()
report(True, "barrier and ibarrier return")

# Gossip: a seeded round with the partner the library names, then an
# explicit pairing (2i <-> 2i+1, an odd rank out names itself).
g = np.arange(5, dtype=np.float64) + 10 * rank
partner = comm.gossip_partner(3)
comm.gossip_average(g, loom.GOSSIP_SEEDED, 3)
want = (np.arange(5) + 10 * rank + np.arange(5) + 10 * partner) / 2
report(np.array_equal(g, want), "gossip_average seeded (partner %d)" % partner)
g = np.arange(5, dtype=np.float32) + 10 * rank
mate = rank ^ 1 if (rank ^ 1) < size else rank
comm.igossip_average(g, mate).wait()
want = ((np.arange(5) + 10 * rank + np.arange(5) + 10 * mate) / 2).astype(np.float32)
report(np.array_equal(g, want), "igossip_average explicit (partner %d)" % mate)
raises(loom.InvalidArgument, lambda: comm.gossip_average(np.zeros(3, dtype=np.int32), mate),
       "gossip_average of int32", "int32")

# ------------------------------------------------------------ point to point
if size > 1:
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    x = np.full(10, rank, np.float32)
    r = np.empty(10, np.float32)
    reqs = [comm.irecv(r, prv), comm.isend(x, nxt)]
    loom.wait_all(reqs)
    same(r, np.full(10, prv, np.float32), "isend/irecv round the ring")
    r[:] = -1
    with loom.group():
        comm.send(x, nxt)
        comm.recv(r, prv)
    same(r, np.full(10, prv, np.float32), "send/recv in a loom.group()")
    if rank == 0:
        comm.send(x * 2, 1)
    elif rank == 1:
        same(comm.recv(np.empty(10, np.float32), 0), np.zeros(10, np.float32),
             "blocking send/recv")
x = np.full(3, rank, np.int32)
r = np.empty(3, np.int32)
rr = comm.irecv(r, rank)
comm.isend(x, rank).wait()
same(rr.wait(), x, "non-blocking send to oneself")

# ------------------------------------------------------------------- errors
e = raises(loom.InvalidArgument, lambda: comm.send(np.ones(2), size + 3), "send to no rank",
           "peer %d" % (size + 3))
report(e is not None and e.result == loom.ERR_INVALID_ARGUMENT and isinstance(e, ValueError)
       and "loom_send" in e.message, "the error carries the result code and the library's message")
raises(loom.InvalidArgument, lambda: comm.allreduce(np.ones((4, 4), np.float32)[:, 0]),
       "a non-contiguous array", "not C-contiguous")
raises(loom.InvalidArgument, lambda: comm.allreduce(np.ones(4, bool)), "a bool array",
       "no Loom datatype")
raises(loom.InvalidArgument, lambda: comm.allreduce([1.0, 2.0]), "a list",
       "not a NumPy array or a torch CPU tensor")
ro = np.ones(4, np.float32)
ro.flags.writeable = False
raises(loom.InvalidArgument, lambda: comm.allreduce(ro), "a read-only array in place",
       "read-only")
raises(loom.InvalidArgument, lambda: comm.allreduce(np.ones(4), "xor"), "an unknown op", "xor")
raises(loom.InvalidArgument, lambda: comm.allreduce(np.ones(4), out=np.ones(5)),
       "out of another size")
raises(loom.InvalidArgument, lambda: comm.broadcast(np.ones(4), size), "broadcast root = size")

# ---------------------------------------------------------------- the GIL
if size > 1:
    # Rank 0 enters a blocking allreduce that rank 1 joins 0.5 s later;
    # meanwhile rank 0's main thread must go on running Python.
    ticks = [0]
    x = np.ones(4, np.float32)
    if rank == 0:
        done = threading.Event()
        t = threading.Thread(target=lambda: (comm.allreduce(x), done.set()))
        t.start()
        t0 = time.time()
        while not done.is_set() and time.time() - t0 < 30:
            ticks[0] += 1
        t.join()
        report(ticks[0] > 10000 and time.time() - t0 >= 0.3,
               "a blocking call releases the GIL (%d loops of Python meanwhile)" % ticks[0])
    else:
        if rank == 1:
            time.sleep(0.5)
        comm.allreduce(x)

# ------------------------------------------------ plain or _opts C calls
@contextlib.contextmanager
def counting(*names):
    """Count the calls of libloom functions the package makes."""
    lib = loom._lib.lib
    counts = dict.fromkeys(names, 0)
    saved = {nm: getattr(lib, nm) for nm in names}

    def wrap(nm, f):
        def w(*a):
            counts[nm] += 1
            return f(*a)
        return w
    for nm in names:
        setattr(lib, nm, wrap(nm, saved[nm]))
    try:
        yield counts
    finally:
        for nm in names:
            setattr(lib, nm, saved[nm])


x = data(rank, 4 * size, "float32")
xs = [data(r, 4 * size, "float32") for r in range(size)]
names = ("loom_allgather", "loom_iallgather", "loom_allgather_opts", "loom_iallgather_opts",
         "loom_reduce_scatter", "loom_ireduce_scatter", "loom_reduce_scatter_opts",
         "loom_ireduce_scatter_opts")
with counting(*names) as cnt:
    same(comm.allgather(x), np.stack(xs), "allgather without a codec")
    same(comm.iallgather(x).wait(), np.stack(xs), "iallgather without a codec")
    same(comm.reduce_scatter(x), reference("sum", xs, "float32")[4 * rank:4 * rank + 4],
         "reduce_scatter without a codec", 1e-5)
    same(comm.ireduce_scatter(x).wait(), reference("sum", xs, "float32")[4 * rank:4 * rank + 4],
         "ireduce_scatter without a codec", 1e-5)
    comm.allgather(x, codec="bf16")
    comm.reduce_scatter(x, codec="bf16")
report(cnt == {"loom_allgather": 1, "loom_iallgather": 1, "loom_allgather_opts": 1,
               "loom_iallgather_opts": 0, "loom_reduce_scatter": 1, "loom_ireduce_scatter": 1,
               "loom_reduce_scatter_opts": 1, "loom_ireduce_scatter_opts": 0},
       "plain loom_(i)allgather / loom_(i)reduce_scatter without a codec, _opts with one (%s)"
       % cnt)

# ------------------------------------------------------ wait_all, wait_any
k = 5
bufs = [data(rank, 50 + i, "float64", salt=i) for i in range(k)]
refs = [reference("sum", [data(r, 50 + i, "float64", salt=i) for r in range(size)], "float64")
        for i in range(k)]
reqs = [comm.iallreduce(b) for b in bufs]
order = []
with counting("loom_wait_any", "loom_wait", "loom_test") as cnt:
    while True:
        i = loom.wait_any(reqs)
        if i is None:
            break
        order.append(i)
        report(reqs[i].done, "wait_any: request %d is done once returned" % i)
report(sorted(order) == list(range(k)) and cnt == {"loom_wait_any": k, "loom_wait": 0,
                                                    "loom_test": 0},
       "wait_any returns each of %d requests once (order %s, calls %s)" % (k, order, cnt))
for i in range(k):
    same(bufs[i], refs[i], "iallreduce %d completed by wait_any" % i, 1e-12)
report(reqs[0].wait() is bufs[0], "wait() after wait_any returns the buffer")
report(loom.wait_any([]) is None, "wait_any([]) is None")
bufs = [data(rank, 30 + i, "int32", salt=i) for i in range(k)]
reqs = [comm.iallreduce(b, "max") for b in bufs]
reqs[1].wait()  # one complete already: skipped
with counting("loom_wait_all", "loom_wait") as cnt:
    loom.wait_all(reqs)
report(cnt == {"loom_wait_all": 1, "loom_wait": 0} and all(r.done for r in reqs),
       "wait_all: one loom_wait_all call completes every request (%s)" % cnt)
for i in range(k):
    same(bufs[i], reference("max", [data(r, 30 + i, "int32", salt=i) for r in range(size)],
                            "int32"), "iallreduce max %d completed by wait_all" % i)
loom.wait_all(reqs)
report(True, "wait_all of requests complete already returns")
raises(loom.InvalidArgument, lambda: loom.wait_any([reqs[0], "x"]), "wait_any of a str",
       "requests[1]")
raises(loom.InvalidArgument, lambda: loom.wait_all([None]), "wait_all of None", "requests[0]")
r2 = comm.ibarrier()
raises(loom.InvalidArgument, lambda: loom.wait_any([r2, reqs[0], r2]),
       "wait_any of a request twice", "requests[2] is requests[0]")
loom.wait_all([r2])
if size > 1:
    # wait_all releases the GIL: rank 0's thread waits in it for rank 1,
    # which starts its part 0.5 s later, while rank 0's main thread runs.
    x = np.ones(8, np.float32)
    if rank == 1:
        time.sleep(0.5)
    reqs = [comm.iallreduce(x), comm.ibarrier()]
    if rank == 0:
        done = threading.Event()
        t = threading.Thread(target=lambda: (loom.wait_all(reqs), done.set()))
        t0 = time.time()
        ticks = 0
        t.start()
        while not done.is_set() and time.time() - t0 < 30:
            ticks += 1
        t.join()
        report(ticks > 10000 and time.time() - t0 >= 0.3 and x[0] == size,
               "wait_all releases the GIL (%d loops of Python meanwhile)" % ticks)
    else:
        loom.wait_all(reqs)

# ------------------------------------------------- encode_ef, reduce_encoded
n = 1000
gx = [np.random.default_rng(70 + i).standard_normal(n).astype(np.float32) for i in range(3)]
c8 = loom.Codec("int8")
st = loom.CodecState()
enc = c8.encode_ef(st, 5, gx[0])
same(enc, c8.encode(gx[0]), "encode_ef with a zero residual = encode")
st.commit(5)
dec = c8.decode(enc, np.empty(n, np.float32))
resid = st.residual(5, np.empty(n, np.float32))
same(resid, gx[0] - dec, "encode_ef + commit: the residual is the input minus its decoding")
dd = np.empty(n, np.float32)
enc2 = c8.encode_ef(st, 5, gx[1], decoded=dd)
y = gx[1] + resid
same(enc2, c8.encode(y), "encode_ef encodes the input plus the residual")
same(dd, c8.decode(enc2, np.empty(n, np.float32)), "encode_ef decoded=")
st.rollback(5)
same(c8.encode_ef(st, 5, gx[1]), enc2, "after rollback: the same bytes again")
st.commit(5)
same(st.residual(5, np.empty(n, np.float32)), y - dd, "commit after the retry")
# A tensor in two chunks, with offsets.
h = n // 2
ea = c8.encode_ef(st, 6, gx[2][:h], tensor_count=n)
eb = c8.encode_ef(st, 6, gx[2][h:], tensor_count=n, offset=h)
st.commit(6)
same(st.residual(6, np.empty(n, np.float32)),
     np.concatenate([gx[2][:h] - c8.decode(ea, np.empty(h, np.float32)),
                     gx[2][h:] - c8.decode(eb, np.empty(n - h, np.float32))]),
     "encode_ef of two chunks (offset=, tensor_count=)")
raises(loom.InvalidArgument, lambda: c8.encode_ef(st, 6, gx[2][:h], tensor_count=n, offset=h + 1),
       "encode_ef beyond tensor_count", "exceed tensor_count")
raises(loom.InvalidArgument, lambda: c8.encode_ef(st, 6, gx[2][:h]),
       "encode_ef of another tensor_count for a key", "tensor_count")
raises(loom.InvalidArgument, lambda: c8.encode_ef(st, 7, gx[2][:h], offset=3),
       "encode_ef with an offset and no tensor_count", "tensor_count")
raises(loom.InvalidArgument, lambda: c8.encode_ef(st, 7, gx[2].astype(np.float64)),
       "encode_ef of float64", "float32")
raises(loom.InvalidArgument, lambda: c8.encode_ef("state", 7, gx[2]), "encode_ef of a str state",
       "CodecState")
st.close()
raises(loom.InvalidUsage, lambda: c8.encode_ef(st, 5, gx[0]), "encode_ef on a closed CodecState",
       "closed")
raises(loom.InvalidUsage, lambda: comm.allreduce(gx[0].copy(), codec="int8", state=st),
       "an allreduce with a closed CodecState", "closed")
for spec in ("bf16", "fp16"):
    cb = loom.Codec(spec)
    ea, eb = cb.encode(gx[0]), cb.encode(gx[1])
    da, db = (cb.decode(e, np.empty(n, np.float32)) for e in (ea, eb))
    res = cb.reduce_encoded(ea.copy(), eb)
    same(res, cb.encode(da + db), "reduce_encoded %s = the encoding of the sum" % spec)
    same(cb.reduce_encoded(ea.copy(), eb.tobytes()), res, "reduce_encoded %s of bytes" % spec)
raises(loom.InvalidArgument, lambda: c8.reduce_encoded(c8.encode(gx[0]), c8.encode(gx[1])),
       "reduce_encoded with int8 (not additive)", "additive")
cb = loom.Codec("bf16")
raises(loom.InvalidArgument, lambda: cb.reduce_encoded(cb.encode(gx[0]), cb.encode(gx[0][:10])),
       "reduce_encoded of different lengths", "src")
raises(loom.InvalidArgument, lambda: cb.reduce_encoded(gx[0].copy(), gx[1]),
       "reduce_encoded of float32 arrays", "uint8")

# --------------------------------------------------- codecs from Python
class Raw:
    """Values as they are, gathered (decode_accumulate only)."""
    name = "py-raw"
    kind = "gather_only"
    threads = set()

    def max_encoded_bytes(self, count):
        return 4 * count

    def encode(self, src, dst):
        Raw.threads.add(threading.get_ident())
        dst[:4 * src.size] = src.view(np.uint8)
        return 4 * src.size

    def decode_accumulate(self, src, acc):
        if src.size != 4 * acc.size:
            raise loom.RemoteError(loom.ERR_REMOTE, "py-raw: %d bytes for %d values"
                                   % (src.size, acc.size))
        acc += src.view(np.float32)


class Step:
    """Multiples of a step (its parameter: "py-step:0.25"), as int32,
    summed on the wire (additive)."""
    name = "py-step"
    kind = loom.CODEC_ADDITIVE

    def __init__(self, step=None):
        self.step = step

    def configure(self, args):
        step = float(args) if args is not None else 0.5
        if not step > 0:
            raise ValueError("py-step: the step must be positive, not %r" % args)
        return Step(step)

    def max_encoded_bytes(self, count):
        return 4 * count

    def encode(self, src, dst):
        dst[:4 * src.size] = np.round(src / self.step).astype(np.int32).view(np.uint8)
        return 4 * src.size

    def decode(self, src, dst):
        if src.size != 4 * dst.size:
            raise loom.RemoteError(loom.ERR_REMOTE, "py-step: wrong length")
        dst[:] = src.view(np.int32) * np.float32(self.step)

    def reduce_encoded(self, dst, src):
        d = dst.view(np.int32)
        d += src.view(np.int32)


class Broken(Raw):
    name = "py-broken"

    def encode(self, src, dst):
        raise RuntimeError("py-broken cannot encode")


loom.register_codec(Raw())
loom.register_codec(Step())
loom.register_codec(Broken())
n = 1003
gx = [np.random.default_rng(90 + r).standard_normal(n).astype(np.float32) for r in range(size)]
# One rank has nothing to send: its allreduce encodes nothing.
x = gx[rank].copy()
comm.allreduce(x, codec="py-raw")
same(x, np.sum(gx, axis=0), "allreduce with a Python gather_only codec", 1e-5)
report(size == 1 or len(Raw.threads) >= 1,
       "the Python codec's encode ran (threads %d)" % len(Raw.threads))
for spec, step in (("py-step:0.25", 0.25), ("py-step", 0.5)):
    q = [np.round(g / step) * np.float32(step) for g in gx] if size > 1 else gx
    x = gx[rank].copy()
    comm.allreduce(x, codec=loom.Codec(spec))
    same(x, np.sum(q, axis=0), "allreduce with a Python additive codec, %s" % spec, 1e-5)
cs = loom.Codec("py-step:0.125")
ea, eb = cs.encode(gx[0]), cs.encode(gx[-1])
same(cs.decode(cs.reduce_encoded(ea.copy(), eb), np.empty(n, np.float32)),
     np.round(gx[0] / 0.125) * np.float32(0.125) + np.round(gx[-1] / 0.125) * np.float32(0.125),
     "Codec.reduce_encoded through a Python reduce_encoded", 1e-6)
e = raises(loom.InvalidArgument, lambda: loom.Codec("py-step:-1"),
           "a parameter the Python configure rejects")
report(e is not None and isinstance(e.__cause__, ValueError),
       "the configure's exception is the error's __cause__ (%r)"
       % (e.__cause__ if e is not None else None))
e = raises(loom.InternalError, lambda: loom.Codec("py-broken").encode(gx[0]),
           "a Python encode that raises")
report(e is not None and "cannot encode" in str(e.__cause__), "its exception is the __cause__")
e = raises(loom.RemoteError,
           lambda: loom.Codec("py-raw").decode(b"abc", np.empty(2, np.float32)),
           "a malformed encoding for a Python decoder", "py-raw: 3 bytes")
report(e is not None and isinstance(e.__cause__, loom.RemoteError),
       "the decoder's RemoteError is the __cause__")
raises(loom.InvalidArgument, lambda: loom.register_codec(Raw()), "registering a name twice",
       "py-raw")
bad = Raw()
bad.name = "py-kind"
bad.kind = "lossy"
raises(loom.InvalidArgument, lambda: loom.register_codec(bad), "a codec of no kind", "kind")
bad.kind = "decode_reduce"
bad.decode_accumulate = None
raises(loom.InvalidArgument, lambda: loom.register_codec(bad), "a codec with no decoder",
       "decode")
raises(loom.InvalidArgument, lambda: loom.register_codec(type("U", (Raw,), {"name": "Bad Name"})()),
       "a codec name with capitals and a space", "name")

# ------------------------------------------------------------ mem_register
x = data(rank, 64, "float32")
ref = reference("sum", [data(r, 64, "float32") for r in range(size)], "float32")
reg = comm.mem_register(x)
comm.allreduce(x)
same(x, ref, "allreduce of a registered buffer", 1e-5)
report(reg.registered and reg.nbytes == 256 and reg.ptr == x.ctypes.data,
       "the registration records the buffer (%r)" % reg)
reg.deregister()
raises(loom.InvalidUsage, reg.deregister, "deregistering twice", "deregistered")
reg.close()
report(not reg.registered, "close() after deregister() is no error")
y = np.arange(16, dtype=np.float64)
wr = weakref.ref(y)
with comm.mem_register(y) as reg:
    del y
    report(wr() is not None, "a registration keeps its buffer alive")
    same(comm.allreduce(wr()), np.arange(16, dtype=np.float64) * size,
         "allreduce in a with mem_register() block")
gc.collect()
report(wr() is None and not reg.registered, "the end of the block deregisters, and drops the buffer")
z = np.ones(8, np.int64)
reg = comm.mem_register(z)
hreg = reg._hreg
del reg
gc.collect()
rc = loom._lib.lib.loom_mem_deregister(comm._h, hreg)
report(rc == loom.ERR_INVALID_ARGUMENT,
       "the finaliser of a Registration deregisters (a second deregister: %d)" % rc)
raises(loom.InvalidArgument, lambda: comm.mem_register([1, 2]), "mem_register of a list",
       "not a NumPy array")
raises(loom.InvalidArgument, lambda: comm.mem_register(np.empty(0)), "mem_register of 0 bytes",
       "empty")

# ---------------------------------------------------------------- windows
m = 300
w = comm.mem_alloc((2, m), "float32")
report(w.shape == (2, m) and w.nbytes == 2 * m * 4 and w.dtype == loom.FLOAT32
       and w.ptr % 4096 == 0, "mem_alloc((2, %d), 'float32'): %r" % (m, w))
a = w.numpy()
report(a.shape == (2, m) and a.dtype == np.float32 and a.ctypes.data == w.ptr,
       "Window.numpy() views the window")
x = data(rank, m, "float32")
ref = reference("sum", [data(r, m, "float32") for r in range(size)], "float32")
a[0] = x
comm.allreduce(a[0], out=a[1])
same(a[1], ref, "allreduce out of place, both buffers in a window", 1e-5)
same(a[0], x, "... its input untouched")
comm.allreduce(a[0], "max")
same(a[0], reference("max", [data(r, m, "float32") for r in range(size)], "float32"),
     "allreduce max in place in a window")
a[0] = x
same(comm.iallreduce(a[0], out=a[1]).wait(), ref, "iallreduce in a window", 1e-5)
for shape, dt, npdt in ((7, np.int32, np.int32), ([3, 4], loom.FLOAT64, np.float64),
                        ((5,), "uint8", np.uint8)):
    w2 = comm.mem_alloc(shape, dt)
    b = w2.numpy()
    b[...] = data(rank, b.size, np.dtype(npdt).name).reshape(b.shape)
    comm.allreduce(b)
    same(b.ravel(), reference("sum", [data(r, b.size, np.dtype(npdt).name) for r in range(size)],
                              np.dtype(npdt).name), "a window of %r %r" % (shape, dt))
    del b
    w2.free()
e = raises(loom.InvalidUsage, w.free, "freeing a window while a view is alive", "alive")
raises(loom.InvalidUsage, comm.close, "closing a communicator while a window's view is alive",
       "still have")
same(comm.allreduce(np.ones(3)), np.full(3, float(size)), "... which left it open")
v = a[1, 10:20]
del a
raises(loom.InvalidUsage, w.free, "freeing a window while a slice of a view is alive", "alive")
del v
w.free()
report(w.live_views() == 0, "free() once no view is left")
raises(loom.InvalidUsage, w.numpy, "a view of a freed window", "freed")
raises(loom.InvalidUsage, w.free, "freeing a window twice", "freed")
w.close()
report(True, "close() of a freed window is no error")
w = comm.mem_alloc(10)
ptr = w.ptr
a = w.numpy()
del w
gc.collect()
a[:] = 3  # the view keeps the window
comm.allreduce(a)
same(a, np.full(10, 3.0 * size, np.float32), "a view outlives its Window object")
del a
gc.collect()
rc = loom._lib.lib.loom_mem_free(comm._h, ptr)
report(rc == loom.ERR_INVALID_ARGUMENT,
       "the window is freed once its views and Window are gone (loom_mem_free again: %d)" % rc)
w = comm.mem_alloc(4, "bfloat16")
raises(loom.InvalidArgument, w.numpy, "Window.numpy() of bfloat16", "bfloat16")
w.free()
raises(loom.InvalidArgument, lambda: comm.mem_alloc(0), "mem_alloc(0)", "no element")
raises(loom.InvalidArgument, lambda: comm.mem_alloc((3, -1)), "mem_alloc of a negative shape",
       "negative")
raises(loom.InvalidArgument, lambda: comm.mem_alloc(4, "bool"), "mem_alloc of bool", "bool")
raises(loom.InvalidArgument, lambda: comm.mem_alloc(4, np.complex64), "mem_alloc of complex64",
       "complex64")
raises(loom.InvalidArgument, lambda: comm.mem_alloc("many"), "mem_alloc('many')", "many")


def in_group():
    with loom.group():
        comm.mem_alloc(4)


raises(loom.InvalidUsage, in_group, "mem_alloc in a loom.group()", "group")

# ---------------------------------------------------- from a unique id
uid = np.zeros(128, np.uint8)
if rank == 0:
    uid[:] = np.frombuffer(loom.get_unique_id(), np.uint8)
comm.broadcast(uid, 0)
c2 = loom.Communicator.from_unique_id(uid.tobytes(), size - 1 - rank, size, timeout=30)
v = np.array([c2.rank], np.int64)
c2.allreduce(v)
report(c2.size == size and c2.rank == size - 1 - rank and v[0] == size * (size - 1) // 2,
       "a communicator from a unique id, ranks reversed (%r)" % c2)
raises(loom.InvalidArgument, lambda: loom.Communicator.from_unique_id(b"x" * 128, 0, 1),
       "a unique id that is not one", "unique")

# ------------------------------------------------------------ mismatch
# The last rank passes another count: every rank raises MismatchError
# (LOOM_ERR_MISMATCH), whose message names that call, on a communicator
# of its own (the difference breaks it).
if size > 1:
    uid = np.zeros(128, np.uint8)
    if rank == 0:
        uid[:] = np.frombuffer(loom.get_unique_id(), np.uint8)
    comm.broadcast(uid, 0)
    cm = loom.Communicator.from_unique_id(uid.tobytes(), rank, size, timeout=30)
    # Every rank's creation over first: a rank still finishing it when
    # the others' calls differ has its creation fail, with the same error.
    cm.barrier()
    n = 5 if rank == size - 1 else 4
    e = raises(loom.MismatchError, lambda: cm.allreduce(np.ones(n, np.float32)),
               "an allreduce of 5 elements on rank %d, 4 on the others" % (size - 1),
               "loom_allreduce(count=5")
    report(e is not None and e.result == loom.ERR_MISMATCH
           and e.name == "LOOM_ERR_MISMATCH", "MismatchError carries LOOM_ERR_MISMATCH")
    cm.close()

# ------------------------------- windows, registrations and close/abort
def new_comm():
    u = np.zeros(128, np.uint8)
    if rank == 0:
        u[:] = np.frombuffer(loom.get_unique_id(), np.uint8)
    comm.broadcast(u, 0)
    c = loom.Communicator.from_unique_id(u.tobytes(), rank, size, timeout=30)
    c.barrier()
    return c


cw = new_comm()
w1 = cw.mem_alloc(6, "int64")
w2 = cw.mem_alloc(6, "int64")
a1 = w1.numpy()
a1[:] = rank
cw.allreduce(a1)
same(a1, np.full(6, size * (size - 1) // 2, np.int64), "allreduce in a window of a second comm")
y = np.ones(5, np.float32)
reg = cw.mem_register(y)
raises(loom.InvalidUsage, cw.close, "close() while a window has a view", "1 window(s)")
del a1
cw.close()
report(True, "close() once no window has a view")
raises(loom.InvalidUsage, w1.numpy, "a view of a window after its communicator's close",
       "freed with its communicator")
raises(loom.InvalidUsage, w2.free, "free() of a window after its communicator's close",
       "freed with its communicator")
w2.close()
raises(loom.InvalidUsage, reg.deregister, "deregister() after the communicator's close",
       "released with its communicator")
reg.close()
raises(loom.InvalidUsage, lambda: cw.mem_alloc(4), "mem_alloc on a closed communicator", "closed")
raises(loom.InvalidUsage, lambda: cw.mem_register(y), "mem_register on a closed communicator",
       "closed")

# abort() with a view alive: revoked at once, aborted when the view goes.
cw = new_comm()
w1 = cw.mem_alloc(8, "float32")
a1 = w1.numpy()
a1[:] = rank + 1
cw.allreduce(a1)
if size > 1:
    # loom_mem_alloc(3): LOOM_ERR_MISMATCH, naming the sizes.
    raises(loom.MismatchError, lambda: cw.mem_alloc(4 + (rank == size - 1)),
           "mem_alloc of different sizes", "asked for")
w3 = cw.mem_alloc(4)
report(w3.live_views() == 0, "mem_alloc after a failed one")
cw.abort()
a1 += 1  # still mapped
same(a1, np.full(8, size * (size + 1) / 2 + 1, np.float32),
     "a window's view outlives abort() of its communicator")
report(cw._zombie is not None and "abort" in repr(w3),
       "abort() left the communicator to the view, freed the window without (%r)" % w3)
raises(loom.InvalidUsage, cw.barrier, "a call after abort()", "closed")
del a1
gc.collect()
report(cw._zombie is None and "abort" in repr(w1),
       "the view gone, the communicator is aborted (%r)" % w1)
raises(loom.InvalidUsage, w1.free, "free() of a window after abort()", "abort")

# wait_any and wait_all with a failing operation: on a communicator of
# this rank alone, a receive that nothing matches, then revoke().
solo = loom.Communicator.from_unique_id(loom.get_unique_id(), 0, 1, timeout=30)
r0 = solo.ibarrier()
r0.wait()
reqs = [r0, solo.irecv(np.empty(3), 0)]
solo.revoke()
got = []
for _ in range(2):
    try:
        got.append(loom.wait_any(reqs))
    except loom.RevokedError as e:
        got.append(e.index)
report(got == [1, None], "wait_any: a failure raises, with its index; then None (%s)" % got)
raises(loom.RevokedError, reqs[1].wait, "wait() of the request wait_any failed raises again")
solo.close()
solo = loom.Communicator.from_unique_id(loom.get_unique_id(), 0, 1, timeout=30)
reqs = [solo.irecv(np.empty(3), 0), solo.ibarrier()]
solo.revoke()
raises(loom.RevokedError, lambda: loom.wait_all(reqs), "wait_all with a revoked receive")
report(all(r.done for r in reqs), "wait_all: every request done after the failure")
raises(loom.RevokedError, reqs[0].wait, "wait() after a failed wait_all raises it too")
solo.close()

# ----------------------------------------------------------- membership
def quiet_barrier(c):
    """A barrier that a rank already past it may revoke on this one."""
    try:
        c.barrier()
    except loom.RevokedError:
        pass


report(c2.get_failed() == [], "get_failed() on a healthy communicator: []")
report(c2.pending_joins() == 0, "pending_joins() == 0")
report(c2.agree(10 + rank, loom.MIN) == 10 and c2.agree(10 + rank, "max") == 10 + size - 1,
       "agree min and max")
report(c2.grow() is None, "grow() with nobody waiting returns None")
st = [np.zeros(5, np.float32), np.zeros(3, np.int64)]
if c2.rank == 0:
    st[0][:] = 1.5
    st[1][:] = 7
c2.barrier()
revision = c2.state_sync(st, 4 if c2.rank == 0 else 0)
report(revision == 4 and np.all(st[0] == 1.5) and np.all(st[1] == 7),
       "state_sync: every rank holds revision 4 of rank 0 (got %d)" % revision)
res, who = c2.get_error()
report(res == 0 and who == -1, "get_error() on a healthy communicator")
# shrink() revokes first: a rank still finishing the call before would
# see it fail.  The barrier completes only once everyone is in it.
quiet_barrier(c2)
c3 = c2.shrink()
report(c3.size == size, "shrink() of a healthy communicator keeps %d ranks (%d)" % (size, c3.size))
raises(loom.RevokedError, lambda: c2.allreduce(np.ones(2)), "an operation after shrink()")
c2.close()
# Likewise the ranks still creating c3 inside shrink() must be done
# before it is revoked (else they build it anew without the others).
quiet_barrier(c3)
c3.revoke()
raises(loom.RevokedError, lambda: c3.allreduce(np.ones(2)), "an operation after revoke()")
c3.close()
raises(loom.InvalidUsage, lambda: c3.barrier(), "a closed communicator", "closed")

# split(): even and odd ranks, keys reversing the order; the last rank
# in no colour.
sub = comm.split(rank % 2, key=-rank)
members = sorted((q for q in range(size) if q % 2 == rank % 2), reverse=True)
report(sub.size == len(members) and sub.rank == members.index(rank),
       "split(rank %% 2, key=-rank): rank %d of %d" % (sub.rank, sub.size))
same(sub.allgather(np.array([rank], dtype=np.int32)).ravel(), np.array(members, dtype=np.int32),
     "split: the new ranks are the old ones by key")
sub.close()
most = comm.split(None if rank == size - 1 else 0, timeout=30)
report((most is None) == (rank == size - 1) and (most is None or most.size == size - 1),
       "split: color None gives None, the others a communicator of %d" % (size - 1))
if most is not None:
    same(most.allreduce(np.ones(3)), np.full(3, float(size - 1)), "split: allreduce on it")
    most.close()
raises(loom.InvalidArgument, lambda: comm.split(-2), "split(-2)", "color -2")

# create_group(): the odd ranks, listed high to low, called by them only.
odd = [q for q in range(size) if q % 2 == 1][::-1]
if rank in odd:
    g = comm.create_group(odd, tag=7)
    report(g.size == len(odd) and g.rank == odd.index(rank),
           "create_group(%s): rank %d of %d" % (odd, g.rank, g.size))
    same(g.allgather(np.array([rank], dtype=np.int32)).ravel(), np.array(odd, dtype=np.int32),
         "create_group: the new ranks in the list's order")
    same(g.allreduce(np.full(4, float(rank))), np.full(4, float(sum(odd))),
         "create_group: allreduce on it")
    g.close()
raises(loom.InvalidArgument, lambda: comm.create_group([]), "create_group([])", "n = 0")
if size > 1:
    raises(loom.InvalidArgument, lambda: comm.create_group([rank, rank]), "create_group([r, r])",
           "repeats")

# ------------------------------------------------------------------- torch
if use_torch:
    import torch
    t = torch.arange(6, dtype=torch.float32) + rank
    p = t.data_ptr()
    comm.allreduce(t)
    report(t.data_ptr() == p and torch.equal(t, torch.arange(6, dtype=torch.float32) * size
                                             + size * (size - 1) / 2),
           "allreduce of a torch tensor, in place")
    for dt in (torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.int8):
        t = torch.full((8,), rank + 1, dtype=dt)
        out = torch.empty_like(t)
        comm.allreduce(t, "max", out=out)
        report(torch.equal(out, torch.full((8,), size, dtype=dt)), "allreduce %s max" % dt)
    b = torch.full((5,), float(rank), dtype=torch.bfloat16)
    same(comm.allgather(b).float().numpy(), np.repeat(np.arange(size, dtype=np.float32), 5)
         .reshape(size, 5), "allgather of bfloat16 tensors")
    t = torch.ones(4, 4)
    raises(loom.InvalidArgument, lambda: comm.allreduce(t[:, 1]), "a non-contiguous tensor",
           "not contiguous")
    raises(loom.InvalidArgument, lambda: comm.allreduce(torch.ones(3, dtype=torch.bool)),
           "a bool tensor", "no Loom datatype")
    raises(loom.InvalidArgument, lambda: comm.allreduce(torch.ones(3), out=np.ones(3, np.float32)
                                                        .astype(np.float64)),
           "tensor in, float64 array out", "different types")
    g = torch.from_numpy(np.random.default_rng(5 + rank).standard_normal(1000)
                         .astype(np.float32))
    ex = torch.zeros(1000)
    for r in range(size):
        ex += torch.from_numpy(np.random.default_rng(5 + r).standard_normal(1000)
                               .astype(np.float32))
    comm.iallreduce(g, codec="int8").wait()
    report(float((g - ex).abs().max() / ex.abs().max()) < 0.05,
           "iallreduce of a tensor with codec=int8")
    rs = comm.reduce_scatter(torch.ones(size * 2, 3))
    report(tuple(rs.shape) == (2, 3) and bool((rs == size).all()),
           "reduce_scatter of a tensor gives a new tensor")
    t = torch.full((4,), float(rank))
    if size > 1:
        with loom.group():
            comm.send(t, (rank + 1) % size)
            comm.recv(torch.empty(4), (rank - 1) % size)
        report(True, "send/recv of tensors in a group")
    for dt in (torch.bfloat16, torch.float32):
        w = comm.mem_alloc((2, 6), dt)
        t = w.torch()
        report(t.dtype == dt and tuple(t.shape) == (2, 6) and t.data_ptr() == w.ptr,
               "Window.torch() of a %s window" % dt)
        t[0] = rank + 1
        comm.allreduce(t[0], out=t[1])
        report(torch.equal(t[1], torch.full((6,), size * (size + 1) / 2, dtype=dt)),
               "allreduce of tensors in a %s window" % dt)
        u = t[1, 2:]
        del t
        raises(loom.InvalidUsage, w.free, "freeing a window while a tensor views it", "alive")
        del u
        w.free()
        report(True, "free() once no tensor views the window")
    st = [torch.zeros(4), torch.zeros(2, dtype=torch.float64)]
    if rank == 0:
        st[0] += 3
        st[1] += 2
    rev = comm.state_sync(st, 1 if rank == 0 else 0)
    report(rev == 1 and bool((st[0] == 3).all()) and bool((st[1] == 2).all()),
           "state_sync of tensors")

comm.close()
if rank == 0:
    print("%d passed, %d failed" % (passed, failed), flush=True)
sys.exit(1 if failed else 0)
