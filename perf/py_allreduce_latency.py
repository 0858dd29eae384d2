#!/usr/bin/python3
"""py_allreduce_latency.py - the time of a small allreduce called from
Python: loom.Communicator.allreduce on a NumPy array (and, with --torch,
torch.distributed.all_reduce over the "loom" backend and over gloo), the
median of --batches batches of --iters calls, as all_reduce_perf -S does from C.

    loomrun -n 4 python3 perf/py_allreduce_latency.py --bytes 8
    loomrun -n 4 all_reduce_perf -b 8 -e 8 -n 2000 -w 200 -S 10 -c 0
"""
import argparse
import statistics
import time

import numpy as np

import loom

p = argparse.ArgumentParser()
p.add_argument("--bytes", type=int, default=8)
p.add_argument("--iters", type=int, default=2000)
p.add_argument("--warmup", type=int, default=200)
p.add_argument("--batches", type=int, default=10)
p.add_argument("--torch", action="store_true")
o = p.parse_args()

comm = loom.Communicator.from_env()
x = np.zeros(o.bytes // 4, np.float32)


def bench(fn):
    for _ in range(o.warmup):
        fn()
    per = o.iters // o.batches
    meds = []
    for _ in range(o.batches):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        meds.append((time.perf_counter() - t0) / per)
    return statistics.median(meds) * 1e6


t_py = bench(lambda: comm.allreduce(x))
if comm.rank == 0:
    print("py_allreduce: ranks=%d bytes=%d loom.Communicator.allreduce (numpy): %.1f us" % (
        comm.size, o.bytes, t_py), flush=True)
if o.torch:
    import torch
    import torch.distributed as dist
    import loom.torch  # noqa: F401
    dist.init_process_group("loom")
    t = torch.zeros(o.bytes // 4)
    t_t = bench(lambda: dist.all_reduce(t))
    if comm.rank == 0:
        print("py_allreduce: ranks=%d bytes=%d torch.distributed.all_reduce (backend loom): "
              "%.1f us" % (comm.size, o.bytes, t_t), flush=True)
    # The same over torch's gloo, a group of the same ranks.
    gloo = dist.new_group(backend="gloo")
    t_g = bench(lambda: dist.all_reduce(t, group=gloo))
    if comm.rank == 0:
        print("py_allreduce: ranks=%d bytes=%d torch.distributed.all_reduce (backend gloo): "
              "%.1f us" % (comm.size, o.bytes, t_g), flush=True)
    dist.destroy_process_group()
comm.close()
