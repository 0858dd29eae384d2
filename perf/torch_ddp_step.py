#!/usr/bin/python3
"""torch_ddp_step.py - DDP step time over the "loom" backend against
"gloo", in one job: the default group is loom's, a gloo group of the same
ranks is made with new_group, and the same model (same initial values,
same data) is trained under DDP over each, in interleaved blocks of
steps.  Rank 0 prints the median step time of each, their ratio, and the
largest difference between the two models' parameters at the end.

Run under loomrun or torchrun (env://), e.g.
    loomrun -n 4 python3 perf/torch_ddp_step.py --width 2048 --layers 4
A communication-bound model: wide layers, a batch of one.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import loom.torch

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, default=2048)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--steps", type=int, default=5, help="steps per block")
p.add_argument("--blocks", type=int, default=6, help="blocks per backend, interleaved")
p.add_argument("--bucket-mb", type=float, default=25)
p.add_argument("--threads", type=int, default=1)
o = p.parse_args()
torch.set_num_threads(o.threads)

dist.init_process_group("loom")
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
comm = loom.torch.communicator()


def make():
    torch.manual_seed(0)
    layers = []
    for _ in range(o.layers):
        layers += [torch.nn.Linear(o.width, o.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


models = {
    "loom": torch.nn.parallel.DistributedDataParallel(make(), bucket_cap_mb=o.bucket_mb),
    "gloo": torch.nn.parallel.DistributedDataParallel(make(), process_group=gloo,
                                                      bucket_cap_mb=o.bucket_mb),
}
opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
nparams = sum(p.numel() for p in models["loom"].parameters())
steps_done = {k: 0 for k in models}


def step(k):
    g = torch.Generator().manual_seed(1000 * steps_done[k] + rank)
    x = torch.randn(o.batch, o.width, generator=g)
    m, opt = models[k], opts[k]
    opt.zero_grad()
    m(x).square().mean().backward()
    opt.step()
    steps_done[k] += 1


times = {k: [] for k in models}
for k in models:  # warm-up (and DDP's first-iteration bucket rebuild)
    for _ in range(2):
        step(k)
for b in range(o.blocks):
    order = ["loom", "gloo"] if b % 2 == 0 else ["gloo", "loom"]
    for k in order:
        for _ in range(o.steps):
            comm.barrier()
            t0 = time.perf_counter()
            step(k)
            times[k].append(time.perf_counter() - t0)

pl = torch.cat([p.detach().reshape(-1) for p in models["loom"].parameters()])
pg = torch.cat([p.detach().reshape(-1) for p in models["gloo"].parameters()])
diff = (pl - pg).abs().max().item()
if rank == 0:
    ml, mg = statistics.median(times["loom"]), statistics.median(times["gloo"])
    print("ddp_step: ranks=%d params=%d (%.1f MB of gradients) batch=%d steps=%d each, "
          "interleaved in %d blocks" % (size, nparams, nparams * 4 / 2 ** 20, o.batch,
                                         len(times["loom"]), o.blocks))
    print("ddp_step: median step loom %.1f ms, gloo %.1f ms: loom %.2fx faster; "
          "max |param difference| after %d steps: %.3g (largest |param| %.3g)" % (
              1e3 * ml, 1e3 * mg, mg / ml, steps_done["loom"], diff, pg.abs().max().item()),
          flush=True)
dist.destroy_process_group()
os._exit(0)
