#!/usr/bin/python3
"""gloo_perf.py - a collective over torch.distributed's gloo backend,
measured as the *_perf benchmarks measure Loom and Open MPI: the sizes
stepped as nccl-tests steps them (-b, -e, -f; the size is the whole buffer
for all_gather, reduce_scatter, alltoall, gather and scatter), -w warm-up
calls, then -n timed calls after a barrier, the mean time per call
averaged over the ranks, the result checked once after (-c 1), and the
nccl-tests table and -J records (out of place only).

    python3 perf/peers/gloo_perf.py all_reduce -N 4 -b 8 -e 64M -f 2 -J rows.json

-N RANKS starts that many local ranks (processes) itself; without it the
rank and size come from RANK and WORLD_SIZE and the rendezvous from
MASTER_ADDR and MASTER_PORT (as torchrun sets them).

torch's all_reduce, reduce and broadcast work in place: out of place, the
input is first copied into the output buffer inside the timed call (the
broadcast: on the root only), so that each call delivers what Loom's and
MPI's do.  Collectives that gloo lacks (reduce_scatter in torch 1.13) give
rows of "n/a" and records whose time is null.  Other options of the perf
binaries are accepted and ignored, with a note.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

COLLS = ("all_reduce", "reduce_scatter", "all_gather", "alltoall", "broadcast",
         "reduce", "gather", "scatter", "sendrecv")
PER_RANK = ("reduce_scatter", "all_gather", "alltoall", "gather", "scatter")
REDUCES = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def size_arg(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:].lower(), 1)
    n = s[:-1] if mult > 1 else s
    if not n.isdigit():
        raise argparse.ArgumentTypeError("not a size: %r" % s)
    return int(n) * mult


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("coll", choices=COLLS)
    p.add_argument("-N", "--nranks", type=int, default=0,
                   help="start this many local ranks")
    p.add_argument("-b", "--minbytes", type=size_arg, default=32 << 20)
    p.add_argument("-e", "--maxbytes", type=size_arg, default=32 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=1)
    p.add_argument("-i", "--stepbytes", type=size_arg, default=1 << 20)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1))
    p.add_argument("-d", "--datatype", default="float",
                   choices=("float", "double", "int32", "int64"))
    p.add_argument("-o", "--op", default="sum", choices=("sum", "prod", "max", "min"))
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-T", "--timeout", type=int, default=0,
                   help="seconds; 0: gloo's own (30 min)")
    p.add_argument("-J", "--json", default=None)
    o, rest = p.parse_known_args()
    if o.root < 0:
        p.error("-r: one root (nccl-tests' -1, every root, is not done here)")
    return o, rest


def sizes(o, nranks, tsize):
    """(bytes, count, per-rank elements) per row, as perf_common.c steps
    and the X_perf.c files round them."""
    rows, b, last = [], o.minbytes, None
    while True:
        if o.coll in PER_RANK:
            per = b // tsize // nranks
            count, nbytes = per, per * nranks * tsize
        else:
            per = count = b // tsize
            nbytes = count * tsize
        if count and nbytes != last:
            rows.append((nbytes, count, per))
            last = nbytes
        nb = b * o.stepfactor if o.stepfactor > 1 else b + o.stepbytes
        if nb > o.maxbytes or nb == b:
            return rows
        b = nb


def launch(o, argv):
    """Start o.nranks copies of this script as the ranks; their status."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(o.nranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(o.nranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__] + strip_n(argv), env=env))
    rc = 0
    try:
        while procs:
            for p in list(procs):
                st = p.poll()
                if st is None:
                    continue
                procs.remove(p)
                if st != 0 and rc == 0:
                    rc = st if st > 0 else 1
                    print("gloo_perf.py: a rank failed (exit %d); stopping the others" % st,
                          file=sys.stderr)
                    for q in procs:
                        q.terminate()
            time.sleep(0.05)
    finally:
        for q in procs:
            q.kill()
    return rc


def strip_n(argv):
    """argv less -N RANKS / --nranks[=]RANKS."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-N", "--nranks"):
            skip = True
        elif not (a.startswith("--nranks=") or (a.startswith("-N") and len(a) > 2)):
            out.append(a)
    return out


def main():
    o, rest = parse()
    if o.nranks > 0:
        return launch(o, sys.argv[1:])

    import datetime
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # a rank a process, as Loom's and MPI's
    kw = {"timeout": datetime.timedelta(seconds=o.timeout)} if o.timeout else {}
    dist.init_process_group("gloo", **kw)
    rank, n = dist.get_rank(), dist.get_world_size()
    if o.root >= n:
        raise SystemExit("gloo_perf.py: -r %d: only %d ranks" % (o.root, n))
    dtype = {"float": torch.float32, "double": torch.float64,
             "int32": torch.int32, "int64": torch.int64}[o.datatype]
    tsize = torch.tensor([], dtype=dtype).element_size()
    op = getattr(dist.ReduceOp, o.op.upper())
    root = o.root if o.coll in ROOTED else -1
    busbw = {"all_reduce": 2.0 * (n - 1) / n, "broadcast": 1.0, "reduce": 1.0,
             "sendrecv": 1.0}.get(o.coll, (n - 1) / n)
    out = sys.stdout if rank == 0 else None
    js = open(o.json, "w") if rank == 0 and o.json else None

    def say(s):
        if out:
            print(s, file=out, flush=True)

    say("# gloo_perf.py %s: torch %s, backend gloo, %d ranks" % (o.coll, torch.__version__, n))
    say("# nThread 1 nGpus 0 minBytes %d maxBytes %d step: %d(%s) warmup iters: %d iters: %d "
        "validation: %d" % (o.minbytes, o.maxbytes, o.stepfactor if o.stepfactor > 1 else o.stepbytes,
                            "factor" if o.stepfactor > 1 else "bytes", o.warmup_iters, o.iters, o.check))
    if rest:
        say("# ignored: %s" % " ".join(rest))
    say("#%75s" % "out-of-place")
    say("#%11s %12s %8s %6s %6s %8s %7s %7s %7s" % ("size", "count", "type", "redop", "root",
                                                   "time", "algbw", "busbw", "#wrong"))
    say("#%11s %12s %37s %7s %7s" % ("(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)"))

    def inputs(r, m):
        """Rank r's input of m elements: small integers, exact in any type."""
        return ((torch.arange(m, dtype=torch.int64) * 7 + r * 3) % 11 - 2).to(dtype)

    def reduced(m):
        x = torch.stack([inputs(r, m) for r in range(n)])
        if o.op == "sum":
            return x.sum(0).to(dtype)
        if o.op == "prod":
            return x.prod(0).to(dtype)
        return (x.max(0) if o.op == "max" else x.min(0)).values

    def setup(per):
        """The call, its buffers, and the expected output (None: any)."""
        c = o.coll
        if c in ("all_reduce", "reduce", "broadcast", "sendrecv"):
            send, recv = inputs(rank, per), torch.zeros(per, dtype=dtype)
        elif c in ("all_gather", "gather"):
            send, recv = inputs(rank, per), torch.zeros(per * n, dtype=dtype)
        else:  # alltoall, scatter, reduce_scatter
            send, recv = inputs(rank, per * n), torch.zeros(per if c != "alltoall" else per * n,
                                                           dtype=dtype)
        views = list(recv.split(per)) if c in ("all_gather", "gather") else None
        parts = list(send.split(per)) if c == "scatter" else None
        if c == "all_reduce":
            def call():
                recv.copy_(send)
                dist.all_reduce(recv, op=op)
            want = reduced(per)
        elif c == "reduce":
            def call():
                recv.copy_(send)
                dist.reduce(recv, root, op=op)
            want = reduced(per) if rank == root else None
        elif c == "broadcast":
            def call():
                if rank == root:
                    recv.copy_(send)
                dist.broadcast(recv, root)
            want = inputs(root, per)
        elif c == "all_gather":
            def call():
                dist.all_gather(views, send)
            want = torch.cat([inputs(r, per) for r in range(n)])
        elif c == "gather":
            def call():
                dist.gather(send, views if rank == root else None, dst=root)
            want = torch.cat([inputs(r, per) for r in range(n)]) if rank == root else None
        elif c == "scatter":
            def call():
                dist.scatter(recv, parts if rank == root else None, src=root)
            want = inputs(root, per * n)[rank * per:(rank + 1) * per]
        elif c == "alltoall":
            def call():
                dist.all_to_all_single(recv, send)
            want = torch.cat([inputs(r, per * n)[rank * per:(rank + 1) * per] for r in range(n)])
        elif c == "sendrecv":
            def call():
                if n == 1:
                    recv.copy_(send)
                    return
                reqs = [dist.isend(send, (rank + 1) % n), dist.irecv(recv, (rank + n - 1) % n)]
                for q in reqs:
                    q.wait()
            want = inputs((rank + n - 1) % n, per)
        else:  # reduce_scatter: ProcessGroupGloo has none in torch 1.13
            def call():
                dist.reduce_scatter(recv, list(send.split(per)), op=op)
            want = reduced(per * n)[rank * per:(rank + 1) * per]
        return call, recv, want

    why = None
    if o.coll == "reduce_scatter":
        try:  # the probe: supported in a later torch?
            x = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter(x[:1].clone(), list(x.split(1)), op=op)
        except RuntimeError as e:
            why = str(e).split("\n")[0]
    if why:
        say("# Skipping %s: not supported by gloo (%s)" % (o.coll, why))
    for nbytes, count, per in sizes(o, n, tsize):
        rec = {"collective": o.coll, "backend": "gloo", "nranks": n, "size": nbytes,
               "count": count, "type": o.datatype, "redop": o.op if o.coll in REDUCES else "none",
               "root": root, "blocking": 1, "iters": o.iters, "warmup_iters": o.warmup_iters,
               "average": 1, "batches": 1}
        if why:
            say("%12d %12d %8s %6s %6d %8s %7s %7s %7s" % (nbytes, count, o.datatype, rec["redop"],
                                                          root, "n/a", "n/a", "n/a", "n/a"))
            rec.update(oop_time_us=None, oop_algbw=None, oop_busbw=None, oop_wrong=None,
                       unsupported=why)
        else:
            call, recv, want = setup(per)
            for _ in range(o.warmup_iters):
                call()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(o.iters):
                call()
            t = torch.tensor([(time.perf_counter() - t0) / o.iters * 1e6], dtype=torch.float64)
            dist.all_reduce(t)
            us = t.item() / n
            wrong = None
            if o.check:
                recv.fill_(-99)
                call()
                w = torch.tensor([0 if want is None else int((recv != want).sum())],
                                 dtype=torch.int64)
                dist.all_reduce(w)
                wrong = int(w.item())
            algbw = nbytes / us / 1e3
            say("%12d %12d %8s %6s %6d %8s %7.2f %7.2f %7s" % (
                nbytes, count, o.datatype, rec["redop"], root,
                "%.2f" % us if us < 1e4 else "%.0f" % us, algbw, algbw * busbw,
                "N/A" if wrong is None else wrong))
            rec.update(oop_time_us=round(us, 3), oop_algbw=round(algbw, 6),
                       oop_busbw=round(algbw * busbw, 6), oop_wrong=wrong)
        if js:
            js.write(json.dumps(rec, separators=(",", ":")) + "\n")
            js.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
