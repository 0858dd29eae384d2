#!/usr/bin/python3
"""torch_ddp_step.py - DDP step time over the "loom" backend against
"gloo", in one job: the default group is loom's, a gloo group of the same
ranks is made with new_group, and the same model (same initial values,
same data) is trained under DDP over each, in interleaved blocks of
steps.  Rank 0 prints the median step time of each, their ratio, and the
largest difference between the two models' parameters at the end.

Run under loomrun or torchrun (env://), e.g.
    loomrun -n 4 python3 perf/torch_ddp_step.py --width 2048 --layers 4
A communication-bound model: wide layers, a batch of one; or an
embedding table (--embed ROWS), whose dense gradient is all to send for
little computation.
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
p.add_argument("--embed", type=int, default=0,
               help="rows of an embedding table in front (dense gradients), 0: none")
p.add_argument("--steps", type=int, default=5, help="steps per block")
p.add_argument("--blocks", type=int, default=6, help="blocks per backend, interleaved")
p.add_argument("--bucket-mb", type=float, default=25)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--codec", help="loom's DDP through loom.torch.compress_hook(CODEC) as well")
o = p.parse_args()
torch.set_num_threads(o.threads)

dist.init_process_group("loom")
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
comm = loom.torch.communicator()


def make():
    torch.manual_seed(0)
    layers = [torch.nn.Embedding(o.embed, o.width)] if o.embed else []
    for _ in range(o.layers):
        layers += [torch.nn.Linear(o.width, o.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


kw = dict(bucket_cap_mb=o.bucket_mb, gradient_as_bucket_view=True)
models = {
    "loom": torch.nn.parallel.DistributedDataParallel(make(), **kw),
    "gloo": torch.nn.parallel.DistributedDataParallel(make(), process_group=gloo, **kw),
    # The floor: DDP whose hook sends nothing (every rank keeps its own
    # gradients), so what the others take more is their communication.
    "none": torch.nn.parallel.DistributedDataParallel(make(), **kw),
}


def no_comm(state, bucket):
    f = torch.futures.Future()
    f.set_result(bucket.buffer())
    return f


models["none"].register_comm_hook(None, no_comm)
if o.codec:
    models["loom+" + o.codec] = torch.nn.parallel.DistributedDataParallel(make(), **kw)
    models["loom+" + o.codec].register_comm_hook(None, loom.torch.compress_hook(o.codec))
opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
nparams = sum(p.numel() for p in models["loom"].parameters())
steps_done = {k: 0 for k in models}


def step(k):
    g = torch.Generator().manual_seed(1000 * steps_done[k] + rank)
    if o.embed:
        x = torch.randint(0, o.embed, (o.batch,), generator=g)
    else:
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
    order = list(models) if b % 2 == 0 else list(reversed(list(models)))
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
    mn = statistics.median(times["none"])
    print("ddp_step: ranks=%d params=%d (%.1f MB of gradients) batch=%d steps=%d each, "
          "interleaved in %d blocks" % (size, nparams, nparams * 4 / 2 ** 20, o.batch,
                                         len(times["loom"]), o.blocks))
    print("ddp_step: median step loom %.1f ms, gloo %.1f ms: loom %.2fx faster; "
          "max |param difference| after %d steps: %.3g (largest |param| %.3g)" % (
              1e3 * ml, 1e3 * mg, mg / ml, steps_done["loom"], diff, pg.abs().max().item()),
          flush=True)
    print("ddp_step: without communication %.1f ms: communication adds loom %.1f ms, "
          "gloo %.1f ms" % (1e3 * mn, 1e3 * (ml - mn), 1e3 * (mg - mn)), flush=True)
    if o.codec:
        k = "loom+" + o.codec
        mc = statistics.median(times[k])
        pc = torch.cat([p.detach().reshape(-1) for p in models[k].parameters()])
        print("ddp_step: median step with compress_hook(%r) %.1f ms: %.2fx faster than gloo; "
              "its parameters within %.2g of gloo's (relative)" % (
                  o.codec, 1e3 * mc, mg / mc, ((pc - pg).norm() / pg.norm()).item()),
              flush=True)
dist.destroy_process_group()
os._exit(0)
