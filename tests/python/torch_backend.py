"""The torch.distributed backend "loom" under torchrun or loomrun (env://),
against references computed on every rank (tests/python/test_torch.sh).

  torch_backend.py calls    every call torch.distributed makes on a
                            backend, sync and async, and new_group
  torch_backend.py ddp      DDP over "loom" against DDP over "gloo" (a
                            gloo group of the same job), same model and
                            data; and DDP with loom.torch.compress_hook
  torch_backend.py groups   (4 ranks) new_group of {0,1}, {2,3} and
                            {1,2,3}: collectives right, at once too, and
                            each made from the default group's
                            communicator (loom.torch.stats: no rendezvous)
  torch_backend.py kill     rank 2 of 3 SIGKILLs itself during DDP
                            training: the others must raise, not hang
  torch_backend.py calls,ddp   both, in one job

Prints "ok"/"FAIL" lines (rank 0: all; others: failures) and exits 1
on a failure.
"""
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import loom
import loom.torch

mode = sys.argv[1] if len(sys.argv) > 1 else "calls"
fails = 0
# No LOOM_* variable is needed: the store torch hands the backend is used.
if mode != "kill":
    for v in ("LOOM_ROOT", "LOOM_RANK", "LOOM_SIZE"):
        os.environ.pop(v, None)
t0 = time.time()
dist.init_process_group("loom")
rank, size = dist.get_rank(), dist.get_world_size()


def check(ok, what):
    global fails
    if not ok:
        fails += 1
    if rank == 0 or not ok:
        os.write(1, ("%s - [rank %d of %d] %s\n" % ("ok  " if ok else "FAIL", rank, size, what))
                 .encode())


def eq(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


check(dist.get_backend() == "loom" and isinstance(loom.torch.communicator(), loom.Communicator),
      "init_process_group('loom') in %.2f s: %r" % (time.time() - t0, loom.torch.communicator()))


def calls():
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        # torchrun's variables alone (MASTER_PORT + 1: torch's store is on
        # MASTER_PORT) make a communicator too.
        c = loom.Communicator.from_env()
        v = torch.ones(2)
        c.allreduce(v)
        check(c.size == size and c.rank == rank and bool((v == size).all()),
              "loom.Communicator.from_env() under torchrun: %r" % c)
        c.close()
    R = dist.ReduceOp
    ops = [(R.SUM, "SUM", lambda s: s.sum(0)), (R.PRODUCT, "PRODUCT", lambda s: s.prod(0)),
           (R.MIN, "MIN", lambda s: s.min(0).values), (R.MAX, "MAX", lambda s: s.max(0).values)]
    if hasattr(R, "AVG"):
        ops.append((R.AVG, "AVG", lambda s: s.sum(0) / size))
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        for op, name, ref in ops:
            if name == "AVG" and not dt.is_floating_point:
                continue
            vals = [torch.arange(1, 8, dtype=torch.float64).mul(r + 1).remainder(5).add(1)
                    for r in range(size)]
            t = vals[rank].to(dt, copy=True)
            dist.all_reduce(t, op=op)
            want = ref(torch.stack(vals)).to(dt)
            check(torch.allclose(t.double(), want.double(), rtol=1e-2 if dt == torch.bfloat16
                                 else 1e-6), "all_reduce %s %s" % (dt, name))
    # async, wait() and get_future()
    t = torch.full((1000,), float(rank))
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    check(w.wait() is True and torch.equal(t, torch.full((1000,), size * (size - 1) / 2))
          and fut.done() and eq(fut.value()[0], t), "all_reduce async_op: wait() and get_future()")
    t = torch.ones(3)
    chained = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check(torch.equal(chained.wait(), torch.full((3,), 2.0 * size)), "get_future().then()")
    # a non-contiguous tensor is handled by a copy
    m = torch.arange(12.0).reshape(3, 4) + rank
    col = m[:, 1]
    dist.all_reduce(col)
    check(torch.equal(m[:, 1], (torch.arange(12.0).reshape(3, 4)[:, 1] * size
                                + size * (size - 1) / 2)), "all_reduce of a non-contiguous view")
    for root in range(size):
        t = torch.arange(5, dtype=torch.int64) + 10 * rank
        dist.broadcast(t, root)
        check(eq(t, torch.arange(5, dtype=torch.int64) + 10 * root), "broadcast from %d" % root)
        t = torch.full((4,), float(rank + 1))
        dist.reduce(t, root, op=R.SUM)
        if rank == root:
            check(torch.equal(t, torch.full((4,), size * (size + 1) / 2)), "reduce to %d" % root)
        outs = [torch.empty(3) for _ in range(size)] if rank == root else None
        dist.gather(torch.full((3,), float(rank)), outs, dst=root)
        if rank == root:
            check(all(torch.equal(outs[r], torch.full((3,), float(r))) for r in range(size)),
                  "gather to %d" % root)
        ins = [torch.full((2,), float(100 * root + r)) for r in range(size)] if rank == root \
            else None
        o = torch.empty(2)
        dist.scatter(o, ins, src=root)
        check(torch.equal(o, torch.full((2,), float(100 * root + rank))), "scatter from %d" % root)
    outs = [torch.empty(2, 3) for _ in range(size)]
    dist.all_gather(outs, torch.full((2, 3), float(rank)))
    check(all(torch.equal(outs[r], torch.full((2, 3), float(r))) for r in range(size)),
          "all_gather")
    if hasattr(dist, "all_gather_into_tensor"):
        o = torch.empty(size * 4)
        dist.all_gather_into_tensor(o, torch.full((4,), float(rank)))
        check(torch.equal(o, torch.arange(size).float().repeat_interleave(4)),
              "all_gather_into_tensor")
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    check(objs == [{"rank": r, "s": "x" * r} for r in range(size)], "all_gather_object")
    o = torch.empty(3)
    dist.reduce_scatter(o, [torch.full((3,), float(rank * 10 + r)) for r in range(size)])
    check(torch.equal(o, torch.full((3,), float(sum(r * 10 + rank for r in range(size))))),
          "reduce_scatter")
    if hasattr(dist, "reduce_scatter_tensor"):
        o = torch.empty(2)
        dist.reduce_scatter_tensor(o, torch.arange(2 * size).float())
        check(torch.equal(o, torch.arange(2 * rank, 2 * rank + 2).float() * size),
              "reduce_scatter_tensor")
    o = torch.empty(size, dtype=torch.int32)
    dist.all_to_all_single(o, torch.arange(size, dtype=torch.int32) + 100 * rank)
    check(eq(o, torch.arange(size, dtype=torch.int32) * 100 + rank), "all_to_all_single")
    outs = [torch.empty(r + 1) for r in range(size)]
    dist.all_to_all(outs, [torch.full((rank + 1,), float(rank * 10 + r)) for r in range(size)])
    check(all(torch.equal(outs[r], torch.full((r + 1,), float(r * 10 + rank)))
              for r in range(size)), "all_to_all of tensors of different sizes")
    # Types Loom does not reduce are still moved, as bytes.
    b = torch.tensor([True, False, rank % 2 == 0])
    dist.broadcast(b, 0)
    check(eq(b, torch.tensor([True, False, True])), "broadcast of a bool tensor")
    outs = [torch.empty(2, dtype=torch.complex64) for _ in range(size)]
    dist.all_gather(outs, torch.full((2,), complex(rank, -rank), dtype=torch.complex64))
    check(all(eq(outs[r], torch.full((2,), complex(r, -r), dtype=torch.complex64))
              for r in range(size)), "all_gather of complex64 tensors")
    o = torch.empty(size, dtype=torch.bool)
    dist.all_to_all_single(o, torch.tensor([(rank + r) % 2 == 0 for r in range(size)]))
    check(eq(o, torch.tensor([(r + rank) % 2 == 0 for r in range(size)])),
          "all_to_all_single of bool")
    dist.barrier()
    check(True, "barrier")
    if size > 1:
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        r_ = torch.empty(6)
        # Receive posted first on every rank: the sends must still start.
        reqs = [dist.irecv(r_, prv), dist.isend(torch.full((6,), float(rank)), nxt)]
        for q in reqs:
            q.wait()
        check(torch.equal(r_, torch.full((6,), float(prv))), "irecv then isend round the ring")
        if rank == 0:
            dist.send(torch.arange(4.0), 1)
        elif rank == 1:
            x = torch.empty(4)
            dist.recv(x, 0)
            check(torch.equal(x, torch.arange(4.0)), "send/recv")
    # new_group: the even ranks, a communicator of their own
    evens = list(range(0, size, 2))
    g = dist.new_group(evens)
    if rank in evens:
        t = torch.ones(2)
        dist.all_reduce(t, group=g)
        c = loom.torch.communicator(g)
        check(torch.equal(t, torch.full((2,), float(len(evens)))) and c.size == len(evens)
              and c.rank == evens.index(rank), "new_group(%s): all_reduce, %r" % (evens, c))
        x = torch.full((3,), float(rank))
        dist.broadcast(x, evens[-1], group=g)
        check(torch.equal(x, torch.full((3,), float(evens[-1]))), "broadcast in new_group")
    t = torch.ones(1)
    dist.all_reduce(t)
    check(t.item() == size, "the default group after new_group")
    # Errors: an unsupported op is a Python error on the caller.
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=R.BAND)
        check(False, "all_reduce BAND raises")
    except Exception as e:  # noqa: BLE001
        check("not supported" in str(e), "all_reduce BAND raises: %s" % e)


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 8))


_teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(7))


def batch(step, who=None):
    """Rank who's batch of a step: inputs and a teacher's labels."""
    g = torch.Generator().manual_seed(1000 * step + (rank if who is None else who))
    x = torch.randn(16, 32, generator=g)
    return x, (x @ _teacher).argmax(1)


def eval_loss(m):
    """The loss on batches no rank trains on, the same on every rank."""
    with torch.no_grad():
        xs = [batch(10 ** 6, w) for w in range(4)]
        return sum(torch.nn.functional.cross_entropy(m(x), y).item() for x, y in xs) / 4


def train(ddp, steps, lr=0.3):
    """Train; the eval loss before and after."""
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    losses = [eval_loss(ddp.module)]
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
    losses.append(eval_loss(ddp.module))
    return losses


def flat_params(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def same_everywhere(v, what):
    h = hashlib.sha256(v.numpy().tobytes()).digest()
    t = torch.tensor(list(h), dtype=torch.uint8)
    allh = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(allh, t)
    check(all(torch.equal(a, allh[0]) for a in allh), "%s: identical on all ranks" % what)


def ddp():
    steps = 10 if os.environ.get("LOOM_TEST_QUICK") == "1" else 20
    gloo = dist.new_group(backend="gloo")
    # Different seeds per rank: DDP's broadcast from rank 0 must fix them.
    a = torch.nn.parallel.DistributedDataParallel(model(rank), bucket_cap_mb=0.01)
    b = torch.nn.parallel.DistributedDataParallel(model(rank), process_group=gloo,
                                                  bucket_cap_mb=0.01)
    same_everywhere(flat_params(a.module), "loom DDP: the parameters after construction")
    la = train(a, steps)
    lb = train(b, steps)
    pa, pb = flat_params(a.module), flat_params(b.module)
    diff = (pa - pb).abs().max().item()
    scale = pb.abs().max().item()
    check(diff <= 1e-5 * scale, "DDP loom vs gloo, %d steps: max |param difference| %.3g "
          "(of %.3g); eval loss %.4f -> %.4f" % (steps, diff, scale, la[0], la[-1]))
    same_everywhere(pa, "loom DDP: the parameters after training")
    check(la[-1] < 0.95 * la[0], "DDP over loom: the eval loss falls")
    c = torch.nn.parallel.DistributedDataParallel(model(rank), bucket_cap_mb=0.01)
    c.register_comm_hook(None, loom.torch.compress_hook("int8"))
    lc = train(c, steps)
    pc = flat_params(c.module)
    rel = ((pc - pb).norm() / pb.norm()).item()
    check(rel < 0.05 and lc[-1] < 0.95 * lc[0] and abs(lc[-1] - la[-1]) < 0.05 * la[-1], "DDP with compress_hook('int8'): parameters within "
          "%.4f of gloo's (relative), eval loss %.4f -> %.4f" % (rel, lc[0], lc[-1]))
    same_everywhere(pc, "compress_hook('int8'): the parameters")
    d = torch.nn.parallel.DistributedDataParallel(model(rank), bucket_cap_mb=0.01)
    d.register_comm_hook(None, loom.torch.compress_hook("int4", error_feedback=True))
    ld = train(d, steps)
    check(ld[-1] < 0.95 * ld[0], "compress_hook('int4', error_feedback=True): the eval loss falls "
          "(%.4f -> %.4f)" % (ld[0], ld[-1]))


def kill():
    """DDP steps; rank 2 dies at step 3; the others must raise."""
    a = torch.nn.parallel.DistributedDataParallel(model(0), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(a.parameters(), lr=0.01)
    t1 = None
    try:
        for s in range(1000):
            if s == 3:
                if rank == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                t1 = time.time()
            x, y = batch(s)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(a(x), y).backward()
            opt.step()
        check(False, "training went on after rank 2 was killed")
    except Exception as e:  # noqa: BLE001
        took = time.time() - (t1 or time.time())
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        check(t1 is not None and took < 20 and "rank 2" in str(e),
              "DDP raised %.1f s after rank 2 died: %s: %s" % (took, type(e).__name__, msg[:200]))
        # The group stays failed: the next call raises at once.
        try:
            one = torch.ones(1)
            w = dist.all_reduce(one, async_op=True)
            w.wait()
            check(False, "all_reduce after the failure raises (%s, %s)" % (one, w.exception()))
        except Exception as e2:  # noqa: BLE001
            check(True, "all_reduce after the failure raises: %s" % str(e2).splitlines()[0][:120])


def groups():
    if size != 4:
        check(False, "groups: 4 ranks, not %d" % size)
        return
    before = dict(loom.torch.stats)
    lists = [[0, 1], [2, 3], [1, 2, 3]]
    gs = [dist.new_group(lst) for lst in lists]  # every rank, in the same order
    mine = [(lst, g) for lst, g in zip(lists, gs) if rank in lst]
    for lst, g in mine:
        c = loom.torch.communicator(g)
        check(c.size == len(lst) and c.rank == lst.index(rank) and dist.get_rank(g) == c.rank,
              "new_group(%s): %r" % (lst, c))
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=g)
        want = float(sum(q + 1 for q in lst))
        check(torch.equal(t, torch.full((5,), want)), "new_group(%s): all_reduce %s" % (lst, want))
        outs = [torch.empty(2) for _ in lst]
        dist.all_gather(outs, torch.full((2,), float(rank)), group=g)
        check(all(torch.equal(o, torch.full((2,), float(q))) for o, q in zip(outs, lst)),
              "new_group(%s): all_gather in the list's order" % lst)
        x = torch.full((3,), float(rank))
        dist.broadcast(x, lst[-1], group=g)
        check(torch.equal(x, torch.full((3,), float(lst[-1]))),
              "new_group(%s): broadcast from %d" % (lst, lst[-1]))
    # The groups of this rank and the default group at once.
    works, want = [], []
    for lst, g in mine + [(list(range(size)), None)]:
        t = torch.full((1000,), float(rank * rank))
        works.append((dist.all_reduce(t, group=g, async_op=True), t))
        want.append(float(sum(q * q for q in lst)))
    for (w, t), v in zip(works, want):
        w.wait()
        check(torch.equal(t, torch.full((1000,), v)), "async all_reduce at once: %s" % v)
    got = {k: loom.torch.stats[k] - before[k] for k in before}
    check(got == {"rendezvous": 0, "derived": len(mine)} and loom.torch.stats["rendezvous"] == 1,
          "new_group x3 made %d communicator(s) from the default one, %d rendezvous (stats %s)"
          % (got["derived"], got["rendezvous"], loom.torch.stats))


for m in mode.split(","):
    {"calls": calls, "ddp": ddp, "kill": kill, "groups": groups}[m]()
if "kill" not in mode:
    dist.destroy_process_group()
if rank == 0:
    os.write(1, ("%s: %s\n" % (mode, "all passed" if not fails else "%d failed" % fails)).encode())
sys.stdout.flush()
os._exit(1 if fails else 0)
